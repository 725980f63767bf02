#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    from omlx_site.process import setup_process

    setup_process()   # the BLAS and malloc settings, before anything imports MLX
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omlx_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
