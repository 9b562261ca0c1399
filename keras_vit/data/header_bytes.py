"""Numbers and signatures read from the first bytes of encoded files, as TensorFlow ops.

`image_limits` (a header's declared size) and `orientation` (a JPEG's EXIF
tag) read encoded images inside graphs: tf.data maps and the
`serving_bytes` signature of an exported SavedModel. Their graphs are built
in Python each time a pipeline or an export is traced, and each field read
byte by byte, and each format told apart by a `tf.cond` / `tf.case` branch
(a function graph of its own), adds to that. Here one vectorised op reads
every field, or checks every signature, of a layout; formats are told apart
by masks.
"""

import numpy as np


def leading_bytes(encoded, count, dtype="int64"):
    """The first `count` bytes of a scalar string tensor as a vector; zeros past its end.

    `dtype`: "int64" (for `fixed_fields` and `numbers_at`) or "uint8".

    Example:

    >>> leading_bytes(b"GIF", 5).numpy().tolist()
    [71, 73, 70, 0, 0]
    """
    import tensorflow as tf

    padded = tf.strings.join([tf.strings.substr(encoded, 0, count), b"\0" * count])
    raw = tf.io.decode_raw(tf.strings.substr(padded, 0, count), tf.uint8)
    return tf.cast(tf.reshape(raw, [count]), dtype)  # its length known to the graph


def fixed_fields(raw, fields):
    """Unsigned integers at fixed places of `raw`, one op for all of them.

    Args:
        raw: int64 vector, the bytes (`leading_bytes`).
        fields: list of `(start, count, byte_order)`, `byte_order` "little"
            or "big".

    Returns:
        A list of int64 scalars, one per field.

    Example:

    >>> raw = leading_bytes(b"\\x01\\x02\\x03", 3)
    >>> [int(v) for v in fixed_fields(raw, [(0, 2, "little"), (1, 2, "big")])]
    [513, 515]
    """
    import tensorflow as tf

    weights = np.zeros((len(fields), int(raw.shape[0])), np.int64)
    for row, (start, count, byte_order) in enumerate(fields):
        powers = 256 ** np.arange(count, dtype=np.int64)
        weights[row, start : start + count] = powers if byte_order == "little" else powers[::-1]
    return tf.unstack(tf.reduce_sum(raw[None, :] * weights, axis=1), num=len(fields))


def signatures_found(raw, signatures):
    """Whether `raw` holds each signature: a list of bool scalars, one op for all of them.

    Args:
        raw: int64 vector, the bytes (`leading_bytes`).
        signatures: list of `{offset: bytes}` dicts, the bytes each
            signature expects where.

    Example:

    >>> raw = leading_bytes(b"RIFF....WEBP", 12)
    >>> [bool(v) for v in signatures_found(raw, [{0: b"RIFF", 8: b"WEBP"}, {0: b"BM"}])]
    [True, False]
    """
    import tensorflow as tf

    expected = np.zeros((len(signatures), int(raw.shape[0])), np.int64)
    checked = np.zeros(expected.shape, bool)
    for row, parts in enumerate(signatures):
        for offset, part in parts.items():
            expected[row, offset : offset + len(part)] = list(part)
            checked[row, offset : offset + len(part)] = True
    matches = tf.reduce_all(tf.equal(raw[None, :], expected) | ~checked, axis=1)
    return tf.unstack(matches, num=len(signatures))


def numbers_at(raw, positions, count, little_endian):
    """Unsigned integers of `count` bytes at data-dependent `positions` of `raw`.

    Positions outside `raw` read its last byte (pad `raw` with zeros to
    make that a zero).

    Args:
        raw: int64 vector, the bytes.
        positions: int64 tensor of any shape, where each number starts.
        count: int, the bytes of each number.
        little_endian: bool scalar tensor (or Python bool), the byte order.

    Returns:
        int64 tensor of the shape of `positions`.
    """
    import tensorflow as tf

    size = int(raw.shape[0])
    indices = tf.clip_by_value(positions[..., None] + np.arange(count, dtype=np.int64), 0, size - 1)
    digits = tf.gather(raw, indices)
    powers = 256 ** np.arange(count, dtype=np.int64)
    return tf.where(
        little_endian,
        tf.reduce_sum(digits * powers, axis=-1),
        tf.reduce_sum(digits * powers[::-1], axis=-1),
    )
