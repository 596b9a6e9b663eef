/*
 * A real user-space NFS client (libnfs, sync API) that the NFS tests and the NFS benchmark
 * drive line by line on stdin; each command gets one line on stdout: "ok ..." or "err ...".
 *
 *   usage: ckptgw-nfs-client nfs://SERVER/EXPORT[?version=3|4&uid=N&gid=N&nfsport=N...]
 *
 *   put LOCAL TMP FINAL  write LOCAL to TMP, fsync (NFS COMMIT), close, rename TMP to FINAL
 *                        (FINAL "-": no rename); "ok BYTES"
 *   get REMOTE LOCAL     read REMOTE whole into LOCAL; "ok BYTES"
 *   open REMOTE          keep a file handle open; "ok ID"
 *   readh ID LOCAL       read the whole file through a kept handle into LOCAL; "ok BYTES"
 *   closeh ID            close a kept handle
 *   pwrite LOCAL REMOTE OFFSET
 *                        write LOCAL into REMOTE (made if missing, not truncated) at OFFSET,
 *                        fsync, close; "ok BYTES"
 *   stat REMOTE          "ok SIZE MODE UID GID MTIME ATIME" (times: seconds since the epoch)
 *   ls REMOTE            the names in a directory, sorted by the server's order; "ok NAME..."
 *   utimes REMOTE ATIME MTIME, chmod REMOTE OCTAL
 *   mkdir|unlink REMOTE, rename OLD NEW
 *   quit
 *
 * Errors read "err CODE MESSAGE" with CODE the negative errno libnfs returns.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <nfsc/libnfs.h>

#define MAX_HANDLES 64
#define CHUNK (1 << 20)

static struct nfs_context *nfs;
static struct nfsfh *handles[MAX_HANDLES];
static char buf[CHUNK];

static int simple_rc(int rc);

static int fail(int rc)
{
	printf("err %d %s\n", rc, nfs_get_error(nfs));
	return rc;
}

static int put(const char *local, const char *tmp, const char *final)
{
	struct nfsfh *fh;
	FILE *in = fopen(local, "rb");
	uint64_t total = 0;
	size_t n;
	int rc;

	if (in == NULL) {
		printf("err %d cannot read %s\n", -errno, local);
		return -1;
	}
	rc = nfs_open2(nfs, tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644, &fh);
	if (rc < 0) {
		fclose(in);
		return fail(rc);
	}
	while ((n = fread(buf, 1, CHUNK, in)) > 0) {
		size_t done = 0;
		while (done < n) {
			rc = nfs_write(nfs, fh, n - done, buf + done);
			if (rc <= 0) {
				fclose(in);
				nfs_close(nfs, fh);
				return fail(rc < 0 ? rc : -EIO);
			}
			done += (size_t)rc;
		}
		total += n;
	}
	fclose(in);
	rc = nfs_fsync(nfs, fh);
	if (rc < 0) {
		nfs_close(nfs, fh);
		return fail(rc);
	}
	rc = nfs_close(nfs, fh);
	if (rc < 0)
		return fail(rc);
	if (strcmp(final, "-") != 0) {
		rc = nfs_rename(nfs, tmp, final);
		if (rc < 0)
			return fail(rc);
	}
	printf("ok %llu\n", (unsigned long long)total);
	return 0;
}

static int read_all(struct nfsfh *fh, const char *local)
{
	FILE *out = fopen(local, "wb");
	uint64_t off = 0;
	int rc;

	if (out == NULL) {
		printf("err %d cannot write %s\n", -errno, local);
		return -1;
	}
	while ((rc = nfs_pread(nfs, fh, off, CHUNK, buf)) > 0) {
		fwrite(buf, 1, (size_t)rc, out);
		off += (uint64_t)rc;
	}
	fclose(out);
	if (rc < 0)
		return fail(rc);
	printf("ok %llu\n", (unsigned long long)off);
	return 0;
}

static int get(const char *remote, const char *local)
{
	struct nfsfh *fh;
	int rc = nfs_open(nfs, remote, O_RDONLY, &fh);

	if (rc < 0)
		return fail(rc);
	rc = read_all(fh, local);
	nfs_close(nfs, fh);
	return rc;
}

static int open_kept(const char *remote)
{
	int id, rc;

	for (id = 0; id < MAX_HANDLES && handles[id] != NULL; id++)
		;
	if (id == MAX_HANDLES) {
		printf("err %d too many kept handles\n", -EMFILE);
		return -1;
	}
	rc = nfs_open(nfs, remote, O_RDONLY, &handles[id]);
	if (rc < 0) {
		handles[id] = NULL;
		return fail(rc);
	}
	printf("ok %d\n", id);
	return 0;
}

static struct nfsfh *kept(const char *arg)
{
	int id = atoi(arg);

	if (id < 0 || id >= MAX_HANDLES || handles[id] == NULL) {
		printf("err %d no kept handle %s\n", -EBADF, arg);
		return NULL;
	}
	return handles[id];
}

static int stat_remote(const char *remote)
{
	struct nfs_stat_64 st;
	int rc = nfs_stat64(nfs, remote, &st);

	if (rc < 0)
		return fail(rc);
	printf("ok %llu %llo %llu %llu %llu %llu\n", (unsigned long long)st.nfs_size,
	       (unsigned long long)st.nfs_mode, (unsigned long long)st.nfs_uid,
	       (unsigned long long)st.nfs_gid, (unsigned long long)st.nfs_mtime,
	       (unsigned long long)st.nfs_atime);
	return 0;
}

static int pwrite_at(const char *local, const char *remote, const char *offset)
{
	struct nfsfh *fh;
	FILE *in = fopen(local, "rb");
	uint64_t off = strtoull(offset, NULL, 10), total = 0;
	size_t n;
	int rc;

	if (in == NULL) {
		printf("err %d cannot read %s\n", -errno, local);
		return -1;
	}
	rc = nfs_open2(nfs, remote, O_WRONLY | O_CREAT, 0644, &fh);
	if (rc < 0) {
		fclose(in);
		return fail(rc);
	}
	while ((n = fread(buf, 1, CHUNK, in)) > 0) {
		rc = nfs_pwrite(nfs, fh, off + total, n, buf);
		if (rc < 0 || (size_t)rc != n) {
			fclose(in);
			nfs_close(nfs, fh);
			return fail(rc < 0 ? rc : -EIO);
		}
		total += n;
	}
	fclose(in);
	rc = nfs_fsync(nfs, fh);
	nfs_close(nfs, fh);
	if (rc < 0)
		return fail(rc);
	printf("ok %llu\n", (unsigned long long)total);
	return 0;
}

static int list_dir(const char *remote)
{
	struct nfsdir *dir;
	struct nfsdirent *ent;
	int rc = nfs_opendir(nfs, remote, &dir);

	if (rc < 0)
		return fail(rc);
	printf("ok");
	while ((ent = nfs_readdir(nfs, dir)) != NULL)
		if (strcmp(ent->name, ".") != 0 && strcmp(ent->name, "..") != 0)
			printf(" %s", ent->name);
	printf("\n");
	nfs_closedir(nfs, dir);
	return 0;
}

static int set_times(const char *remote, const char *atime, const char *mtime)
{
	struct timeval tv[2] = {
		{ .tv_sec = (time_t)strtoll(atime, NULL, 10), .tv_usec = 0 },
		{ .tv_sec = (time_t)strtoll(mtime, NULL, 10), .tv_usec = 0 },
	};

	return simple_rc(nfs_utimes(nfs, remote, tv));
}

static int simple_rc(int rc)
{
	if (rc < 0)
		return fail(rc);
	printf("ok\n");
	return 0;
}

static void run(char *line)
{
	char *argv[4] = { NULL, NULL, NULL, NULL };
	char *save = NULL;
	int argc = 0;
	struct nfsfh *fh;

	for (char *tok = strtok_r(line, " \n", &save); tok != NULL && argc < 4;
	     tok = strtok_r(NULL, " \n", &save))
		argv[argc++] = tok;
	if (argc == 0)
		return;
	if (strcmp(argv[0], "put") == 0 && argc == 4)
		put(argv[1], argv[2], argv[3]);
	else if (strcmp(argv[0], "get") == 0 && argc == 3)
		get(argv[1], argv[2]);
	else if (strcmp(argv[0], "open") == 0 && argc == 2)
		open_kept(argv[1]);
	else if (strcmp(argv[0], "readh") == 0 && argc == 3) {
		if ((fh = kept(argv[1])) != NULL)
			read_all(fh, argv[2]);
	} else if (strcmp(argv[0], "closeh") == 0 && argc == 2) {
		if ((fh = kept(argv[1])) != NULL) {
			handles[atoi(argv[1])] = NULL;
			simple_rc(nfs_close(nfs, fh));
		}
	} else if (strcmp(argv[0], "stat") == 0 && argc == 2)
		stat_remote(argv[1]);
	else if (strcmp(argv[0], "pwrite") == 0 && argc == 4)
		pwrite_at(argv[1], argv[2], argv[3]);
	else if (strcmp(argv[0], "ls") == 0 && argc == 2)
		list_dir(argv[1]);
	else if (strcmp(argv[0], "utimes") == 0 && argc == 4)
		set_times(argv[1], argv[2], argv[3]);
	else if (strcmp(argv[0], "chmod") == 0 && argc == 3)
		simple_rc(nfs_chmod(nfs, argv[1], (int)strtol(argv[2], NULL, 8)));
	else if (strcmp(argv[0], "mkdir") == 0 && argc == 2)
		simple_rc(nfs_mkdir(nfs, argv[1]));
	else if (strcmp(argv[0], "unlink") == 0 && argc == 2)
		simple_rc(nfs_unlink(nfs, argv[1]));
	else if (strcmp(argv[0], "rename") == 0 && argc == 3)
		simple_rc(nfs_rename(nfs, argv[1], argv[2]));
	else
		printf("err %d unknown command or wrong arguments: %s\n", -EINVAL, argv[0]);
}

int main(int argc, char **argv)
{
	struct nfs_url *url;
	char line[8192];
	const char *timeout = getenv("CKPTGW_NFS_TIMEOUT_MS");

	if (argc != 2) {
		fprintf(stderr, "usage: %s nfs://SERVER/EXPORT[?version=3&uid=N&gid=N]\n", argv[0]);
		return 2;
	}
	nfs = nfs_init_context();
	if (nfs == NULL) {
		fprintf(stderr, "cannot create an NFS context\n");
		return 1;
	}
	url = nfs_parse_url_dir(nfs, argv[1]);
	if (url == NULL) {
		fprintf(stderr, "bad URL %s: %s\n", argv[1], nfs_get_error(nfs));
		return 2;
	}
	nfs_set_timeout(nfs, timeout != NULL ? atoi(timeout) : 60000);
	if (nfs_mount(nfs, url->server, url->path) != 0) {
		printf("err %d mount %s:%s: %s\n", -EACCES, url->server, url->path,
		       nfs_get_error(nfs));
		fflush(stdout);
		return 1;
	}
	printf("ok mounted\n");
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin) != NULL) {
		if (strncmp(line, "quit", 4) == 0)
			break;
		run(line);
		fflush(stdout);
	}
	for (int i = 0; i < MAX_HANDLES; i++)
		if (handles[i] != NULL)
			nfs_close(nfs, handles[i]);
	nfs_umount(nfs);
	nfs_destroy_url(url);
	nfs_destroy_context(nfs);
	return 0;
}
