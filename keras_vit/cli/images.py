"""Image files read for `predict` and `inspect`: checked from their headers, then decoded."""

import os
import re
import sys


def missing_files(paths):
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise ValueError(f"no such image file(s): {missing}")


def read_images(command, paths, height, width, channels, max_pixels=None):
    """Image files as one float batch, prepared like evaluation images.

    Each file is checked from its header first (size limits: nothing above
    them is decoded). Returns `(paths, images)` of the files that decoded;
    each one that did not is reported on standard error with its cause.
    """
    import numpy as np
    import tensorflow as tf

    from keras_vit.data import image_limits
    from keras_vit.data.pipeline import decode_for_eval

    kept, images = [], []
    for path in paths:
        try:
            source_height, source_width = image_limits.check_file(path, max_pixels)
            images.append(
                decode_for_eval(
                    tf.io.read_file(path), (height, width), channels, max_pixels=max_pixels
                )
            )
        except image_limits.ImageTooLarge as error:
            print(f"keras-vit {command}: {path}: {error} (--max-image-pixels)", file=sys.stderr)
            continue
        except ValueError as error:
            print(f"keras-vit {command}: {path}: {error}", file=sys.stderr)
            continue
        except tf.errors.InvalidArgumentError as error:
            cause = re.sub(r"\{\{.*?\}\}|\[Op:.*$", "", error.message.strip().splitlines()[0])
            cause = cause.strip().rstrip(".")
            print(
                f"keras-vit {command}: {path}: could not be decoded ({cause}); a truncated "
                "or damaged file, or an encoding TensorFlow does not read",
                file=sys.stderr,
            )
            continue
        if source_height < height or source_width < width:
            print(
                f"keras-vit {command}: {path}: warning: {source_width}x{source_height} image "
                f"upscaled to the model's {width}x{height}",
                file=sys.stderr,
            )
        kept.append(path)
    return kept, (np.stack(images) if images else None)
