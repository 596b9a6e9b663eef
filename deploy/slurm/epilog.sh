#!/bin/bash
# Slurm epilog (runs as root on every node of the job, after it ends, however it ended): wait
# until everything the job wrote on this node is in the store, so the job's checkpoints are
# durable when it is reported finished.
#
# slurm.conf:  Epilog=/etc/slurm/ckptgw-epilog.sh
#              EpilogMsgTime / UnkillableStepTimeout do not bound this; the wait below does.
# Always exits 0: a non-zero epilog drains the node, and data not yet in the store is safe in
# the cache, where the gateway keeps draining it (and a remount of that cache drains it too).
# Docs: docs/deploy/slurm.md
set -uo pipefail

ENV_FILE=${CKPTGW_ENV:-/etc/ckptgw/slurm.env}
if [[ -r $ENV_FILE ]]; then
    # shellcheck source-path=SCRIPTDIR source=ckptgw.env
    source "$ENV_FILE"
fi
CKPTGW=${CKPTGW:-/usr/local/bin/ckptgw}
MOUNTPOINT=${CKPTGW_MOUNTPOINT:-/mnt/ckpt}
TIMEOUT=${CKPTGW_EPILOG_TIMEOUT:-600}
UMOUNT=${CKPTGW_UMOUNT_AFTER_JOB:-0}

log() { logger -t ckptgw-epilog -- "job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null || echo "ckptgw-epilog: $*" >&2; }

if ! "$CKPTGW" status "$MOUNTPOINT" --json >/dev/null 2>&1; then
    log "no gateway serving $MOUNTPOINT: nothing to flush"
    exit 0
fi

# The job's own directory first when there is one, then everything else on the mount.
target=$MOUNTPOINT
if [[ -n ${SLURM_JOB_USER:-} && -d $MOUNTPOINT/$SLURM_JOB_USER ]]; then
    target=$MOUNTPOINT/$SLURM_JOB_USER
fi
if out=$("$CKPTGW" flush "$target" --wait --timeout "$TIMEOUT" 2>&1); then
    log "everything under $target is in the store"
else
    # Exit 3: still not durable at the timeout; the list says what and why.
    log "not all in the store after ${TIMEOUT}s (it keeps draining from the cache): $out"
fi

if [[ $UMOUNT == 1 ]]; then
    # Files still open (a leftover process) also make umount refuse.
    # Without --force: if anything is still not in the store, the mount stays and keeps draining.
    if ! out=$("$CKPTGW" umount "$MOUNTPOINT" --timeout 0 2>&1); then
        log "umount $MOUNTPOINT: $out"
    fi
fi
exit 0
