"""``ckptgw serve nfs``: the mount exported over NFS by NFS-Ganesha."""
