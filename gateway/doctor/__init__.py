"""``ckptgw doctor``: the checks of the host, the store and a running gateway."""
