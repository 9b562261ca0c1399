"""`python -m keras_vit.cli`: the `keras-vit` command line."""

import sys

from keras_vit.cli import main

sys.exit(main())
