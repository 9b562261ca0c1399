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

    is_jpeg = tf.equal(tf.strings.substr(encoded, 0, 3), b"\xff\xd8\xff")
    return tf.cond(is_jpeg, lambda: _jpeg_orientation(encoded),
                   lambda: tf.constant(1, tf.int32))


def _jpeg_orientation(encoded):
    import tensorflow as tf

    # Bytes past the end read as zeros: room for the directory after the segment.
    size = SEARCH_BYTES + 12 * _MAX_ENTRIES + 64
    padded = tf.strings.join([tf.strings.substr(encoded, 0, size), b"\0" * size])
    raw = tf.cast(tf.io.decode_raw(tf.strings.substr(padded, 0, size), tf.uint8), tf.int32)
    found = tf.ones([SEARCH_BYTES], tf.bool)
    for offset, byte in enumerate(_APP1_EXIF):
        if byte is not None:
            found = tf.logical_and(found, tf.equal(raw[offset:offset + SEARCH_BYTES], byte))
    tiff = tf.cast(tf.argmax(tf.cast(found, tf.int32)), tf.int32) + len(_APP1_EXIF)

    def byte_at(position):
        return tf.gather(raw, tf.clip_by_value(position, 0, size - 1))

    little = tf.logical_and(tf.equal(byte_at(tiff), 0x49), tf.equal(byte_at(tiff + 1), 0x49))
    big = tf.logical_and(tf.equal(byte_at(tiff), 0x4D), tf.equal(byte_at(tiff + 1), 0x4D))

    def number(position, count):
        digits = [byte_at(position + i) for i in range(count)]
        return tf.where(little, sum(d * 256**i for i, d in enumerate(digits)),
                        sum(d * 256**i for i, d in enumerate(reversed(digits))))

    directory = tiff + number(tiff + 4, 4)
    entries = directory + 2 + 12 * tf.range(_MAX_ENTRIES)
    listed = tf.range(_MAX_ENTRIES) < number(directory, 2)
    is_orientation = tf.logical_and(listed, tf.equal(number(entries, 2), 0x0112))
    # A SHORT value sits in the first two bytes of the entry's value field.
    value = tf.reduce_max(tf.where(is_orientation, number(entries + 8, 2), 0))
    valid = tf.reduce_any(found) & (little | big) & (value >= 1) & (value <= 8)
    return tf.where(valid, value, 1)


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

    branches = [
        lambda: image,
        lambda: tf.reverse(image, [1]),
        lambda: tf.reverse(image, [0, 1]),
        lambda: tf.reverse(image, [0]),
        lambda: tf.transpose(image, [1, 0, 2]),
        lambda: tf.image.rot90(image, 3),
        lambda: tf.reverse(tf.transpose(image, [1, 0, 2]), [0, 1]),
        lambda: tf.image.rot90(image, 1),
    ]
    index = tf.where((orientation >= 1) & (orientation <= 8), orientation - 1, 0)
    return tf.switch_case(tf.cast(index, tf.int32), branches)
