#!/bin/bash
# Slurm prolog for compute nodes of an NFS gateway: mount the gateway's export over NFS (no
# FUSE, no ckptgw on the node). The gateway node runs ckptgw mount + ckptgw serve nfs
# (deploy/systemd/ckptgw-nfs@.service). Exit non-zero: Slurm drains the node and requeues the
# job, rather than let it train without its checkpoint directory. Docs: docs/deploy/nfs.md
set -euo pipefail
CKPTGW_NFS_SERVER=${CKPTGW_NFS_SERVER:?set CKPTGW_NFS_SERVER to the gateway node in ckptgw.env}
CKPTGW_MOUNTPOINT=${CKPTGW_MOUNTPOINT:-/mnt/ckpt}
CKPTGW_NFS_EXPORT=${CKPTGW_NFS_EXPORT:-/checkpoints}
CKPTGW_NFS_OPTIONS=${CKPTGW_NFS_OPTIONS:-vers=4.1,hard,timeo=600}

if findmnt -n -t nfs,nfs4 "$CKPTGW_MOUNTPOINT" >/dev/null; then
	exit 0 # mounted by an earlier job: keep it
fi
mkdir -p "$CKPTGW_MOUNTPOINT"
if ! mount -t nfs -o "$CKPTGW_NFS_OPTIONS" \
	"$CKPTGW_NFS_SERVER:$CKPTGW_NFS_EXPORT" "$CKPTGW_MOUNTPOINT"; then
	echo "ckptgw nfs prolog: cannot mount $CKPTGW_NFS_SERVER:$CKPTGW_NFS_EXPORT" >&2
	exit 1
fi
