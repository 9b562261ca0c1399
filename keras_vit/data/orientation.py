"""Photos the right way up: the EXIF orientation of a JPEG, applied after decoding.

A phone stores a photo as its sensor read it and records in the JPEG's EXIF
data how to turn it (the `Orientation` tag, 0x0112: 1 is upright, 6 is "turn
90 degrees clockwise", ...). `tf.io.decode_image` ignores the tag, so a
portrait photo arrives sideways. `exif_orientation` reads the tag with
TensorFlow ops (so the `serving_bytes` signature of an exported SavedModel
does it in its graph, as the image folders and `keras-vit predict` do in
theirs) and `upright` turns the decoded image as the tag says, as image
viewers and PIL's `ImageOps.exif_transpose` do.
"""

import numpy as np

# Where to look for the EXIF segment. The EXIF standard puts it right after
# the JPEG's start (a JFIF segment may come first); its first directory
# (IFD0), which holds the tag, follows its header.
SEARCH_BYTES = 4096
_MAX_ENTRIES = 64  # IFD0 entries read (cameras write about a dozen)
_APP1_EXIF = (0xFF, 0xE1, None, None) + tuple(b"Exif\0\0")  # marker, length, name


def exif_orientation(encoded):
    """The EXIF orientation (1 to 8) of encoded image bytes; 1 without one.

    Reads the `Orientation` tag of the EXIF segment of a JPEG (either byte
    order); other formats, a JPEG without EXIF data or without the tag, and
    values outside 1-8 give 1 (upright).

    Args:
        encoded: scalar string tensor, one encoded image.

    Returns:
        An int32 scalar tensor.

    Example:

    >>> import tensorflow as tf
    >>> int(exif_orientation(tf.io.encode_jpeg(tf.zeros((4, 4, 3), tf.uint8))))
    1
    """
    import tensorflow as tf

    from keras_vit.data.header_bytes import leading_bytes, numbers_at

    # Bytes past the end read as zeros: room for the directory after the segment.
    size = SEARCH_BYTES + 12 * _MAX_ENTRIES + 64
    raw = leading_bytes(encoded, size, "uint8")
    # The segment's start: the first offset whose following bytes match.
    offsets = [i for i, byte in enumerate(_APP1_EXIF) if byte is not None]
    windows = tf.gather(raw, np.arange(SEARCH_BYTES, dtype=np.int32)[:, None] + offsets)
    found = tf.reduce_all(
        tf.equal(windows, np.array([_APP1_EXIF[i] for i in offsets], np.uint8)), axis=1
    )
    raw = tf.cast(raw, tf.int64)
    tiff = tf.argmax(tf.cast(found, tf.int64)) + len(_APP1_EXIF)
    order = tf.gather(raw, tiff + [0, 1])
    little = tf.reduce_all(tf.equal(order, 0x49))
    big = tf.reduce_all(tf.equal(order, 0x4D))

    directory = tiff + numbers_at(raw, tiff + 4, 4, little)
    entries = directory + 2 + 12 * np.arange(_MAX_ENTRIES)
    listed = np.arange(_MAX_ENTRIES) < numbers_at(raw, directory, 2, little)
    is_orientation = listed & tf.equal(numbers_at(raw, entries, 2, little), 0x0112)
    # A SHORT value sits in the first two bytes of the entry's value field.
    value = tf.reduce_max(
        tf.where(is_orientation, numbers_at(raw, entries + 8, 2, little), tf.zeros_like(entries))
    )
    is_jpeg = tf.reduce_all(tf.equal(raw[:3], [0xFF, 0xD8, 0xFF]))
    valid = is_jpeg & tf.reduce_any(found) & (little | big) & (value >= 1) & (value <= 8)
    return tf.cast(tf.where(valid, value, tf.ones_like(value)), tf.int32)


def upright(image, orientation):
    """A decoded `(height, width, channels)` image turned as its EXIF `orientation` says.

    Orientation 2 mirrors it, 3 turns it 180 degrees, 4 flips it upside
    down, 5 transposes it, 6 turns it 90 degrees clockwise, 7 transposes it
    across the other diagonal and 8 turns it 90 degrees anticlockwise; 1 (or
    any other value) leaves it as it is.

    Example:

    >>> import tensorflow as tf
    >>> image = tf.reshape(tf.range(6), (2, 3, 1))
    >>> upright(image, 6)[..., 0].numpy().tolist()  # 90 degrees clockwise
    [[3, 0], [4, 1], [5, 2]]
    """
    import tensorflow as tf

    # Each orientation is a transpose or not, then a flip of the rows, the
    # columns, both or neither; as data-dependent arguments of one op each,
    # not eight branches (graphs built each time a pipeline is traced).
    orientation = tf.convert_to_tensor(orientation)
    orientation = tf.where(
        (orientation >= 1) & (orientation <= 8), orientation, tf.ones_like(orientation)
    )
    transposed = orientation >= 5
    flip_rows = tf.reduce_any(tf.equal(orientation, [3, 4, 7, 8]))
    flip_columns = tf.reduce_any(tf.equal(orientation, [2, 3, 6, 7]))
    image = tf.transpose(image, tf.where(transposed, [1, 0, 2], [0, 1, 2]))
    return tf.reverse(image, tf.boolean_mask([0, 1], tf.stack([flip_rows, flip_columns])))
