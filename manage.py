#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    from omlx_site.process import setup_process

    setup_process()   # the BLAS and malloc settings, before anything imports MLX
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omlx_site.settings")
    from django.core.management import execute_from_command_line

    import pool.blas  # noqa: F401 - importing pool loads an optimized BLAS before anything imports MLX

    execute_from_command_line(sys.argv)
