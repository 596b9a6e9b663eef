#!/bin/bash
# Slurm prolog (runs as root on every node of the job, before it starts): make sure this node's
# gateway is mounted, and give the job's user a directory of their own on it.
#
# slurm.conf:  Prolog=/etc/slurm/ckptgw-prolog.sh
#              PrologFlags=Alloc     # run at allocation, on every node of the job
# A non-zero exit here drains the node and requeues the job: a job that cannot checkpoint
# should not start. Docs: docs/deploy/slurm.md
set -euo pipefail

ENV_FILE=${CKPTGW_ENV:-/etc/ckptgw/slurm.env}
if [[ -r $ENV_FILE ]]; then
    # shellcheck source-path=SCRIPTDIR source=ckptgw.env
    source "$ENV_FILE"
fi
CKPTGW=${CKPTGW:-/usr/local/bin/ckptgw}
MOUNTPOINT=${CKPTGW_MOUNTPOINT:-/mnt/ckpt}
CONFIG=${CKPTGW_CONFIG:-/etc/ckptgw/ckptgw.toml}

log() { logger -t ckptgw-prolog -- "job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null || echo "ckptgw-prolog: $*" >&2; }

if "$CKPTGW" status "$MOUNTPOINT" --json >/dev/null 2>&1; then
    log "gateway already serving $MOUNTPOINT"
else
    mkdir -p "$MOUNTPOINT"
    # A gateway that died left a stale mount: mount clears it and recovers the cache's journal.
    # --allow-other: the job runs as its user, not root; file modes still apply.
    if ! out=$("$CKPTGW" mount "$MOUNTPOINT" --config "$CONFIG" --allow-other 2>&1); then
        log "cannot mount $MOUNTPOINT: $out"
        exit 1
    fi
    log "mounted $MOUNTPOINT"
fi

# A directory per user, owned by them: jobs write under $MOUNTPOINT/$SLURM_JOB_USER.
if [[ -n ${SLURM_JOB_USER:-} ]]; then
    userdir="$MOUNTPOINT/$SLURM_JOB_USER"
    if [[ ! -d $userdir ]]; then
        mkdir -p "$userdir"
        chown "$SLURM_JOB_USER" "$userdir"
        chmod 0750 "$userdir"
    fi
fi
exit 0
