"""Limits on untrusted encoded images, checked from their headers before decoding.

A PNG, GIF, JPEG or WebP of a few kilobytes can declare 50,000 x 50,000 pixels: the
decoder allocates the whole image (and the pipeline a float32 copy of it)
before it finds out what the data holds. Every place that decodes bytes it
did not make (the `serving_bytes` signature, image folders, `keras-vit
predict` and `inspect`) first reads the width and height from the header and
refuses images above `max_pixels`, and files above `max_bytes`.

The defaults (`MAX_PIXELS`: 64 megapixels, e.g. 8,000 x 8,000, above the
photos of current phone cameras; `MAX_BYTES`: 64 MiB) can be changed per call
(`max_pixels=`, `max_bytes=`) or for the process by assigning the module's
constants before building a pipeline or an export.
"""

import io
import os
import struct

MAX_PIXELS = 64_000_000
MAX_BYTES = 64 * 2**20

_PNG = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers, which carry the image size (not DHT C4, JPG C8, DAC CC).
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


class ImageTooLarge(ValueError):
    """An encoded image whose header or size is above the limits."""


class TruncatedImage(ValueError):
    """An encoded image whose data ends before the image does (an interrupted copy)."""


_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"


def _png_complete(stream, size):
    """Whether a PNG's chunks reach its IEND chunk within the file."""
    stream.seek(size - len(_PNG_END))
    if stream.read(len(_PNG_END)) == _PNG_END:
        return True
    position = len(_PNG)
    while position + 8 <= size:  # data after IEND is allowed: walk the chunks
        stream.seek(position)
        length, kind = struct.unpack(">I4s", stream.read(8))
        if kind == b"IEND":
            return True
        position += 12 + length  # length, type, data, CRC
    return False


def _jpeg_complete(stream, size):
    """Whether a JPEG's end-of-image marker follows its first scan's start.

    Skipping the segments before the scan by their lengths skips an EXIF
    thumbnail (a whole JPEG with its own end marker) too. In the scan's
    data a 0xFF byte is always stuffed or a restart marker, so an end
    marker there is the image's end; photos with data after it (motion
    photos append a video) are complete.
    """
    stream.seek(size - 2)
    if stream.read(2) == b"\xff\xd9":
        return True
    position = 2
    while position + 4 <= size:
        stream.seek(position)
        marker, length = struct.unpack(">2sH", stream.read(4))
        if marker[0] != 0xFF:
            return False
        if marker[1] == 0xDA:  # start of scan
            stream.seek(position + 2 + length)
            return stream.read(size).find(b"\xff\xd9") >= 0
        position += 2 + length
    return False


def _gif_complete(stream, size):
    """Whether a GIF's first image ends within the file.

    The decoder needs the first frame only (a cut in a later frame of an
    animation, or a missing trailer, still decodes). A GIF declares no
    length: its blocks, and their data in sub-blocks of at most 255 bytes,
    are walked to the end of the first image. A block of an unknown kind
    ends the walk as complete (the decoder, not this test, refuses it).
    """
    stream.seek(0)
    data = stream.read(size)

    def color_table(flags):
        return 3 << ((flags & 7) + 1) if flags & 0x80 else 0

    def after_sub_blocks(position):  # None: the file ends inside them
        while position < size:
            length = data[position]
            position += 1 + length
            if length == 0:
                return position
        return None

    if size < 13:
        return False
    position = 13 + color_table(data[10])  # header, screen descriptor, global colours
    while position is not None and position < size:
        block = data[position]
        if block == 0x21:  # extension: label, then sub-blocks
            position = after_sub_blocks(position + 2)
        elif block == 0x2C:  # image: descriptor, local colours, LZW code size, sub-blocks
            if position + 10 > size:
                return False
            return after_sub_blocks(position + 11 + color_table(data[position + 9])) is not None
        else:
            return True
    return False


def check_complete(stream, kind, size):
    """Raises `TruncatedImage` for a PNG, JPEG, GIF, WebP or BMP file cut short.

    Each test is certain (no complete file fails it) and reads a few bytes
    at the file's end, or walks its segment headers when something follows
    the image's end (a GIF's blocks are always walked to its first image's
    end: it has no end marker in a fixed place). Other kinds pass.
    """
    if kind == "png":
        complete = _png_complete(stream, size)
    elif kind == "jpeg":
        complete = _jpeg_complete(stream, size)
    elif kind == "gif":
        complete = _gif_complete(stream, size)
    elif kind in ("webp", "bmp"):
        # The size each declares in its header: RIFF's after 8 bytes, BMP's (0: unset).
        stream.seek(4 if kind == "webp" else 2)
        declared = struct.unpack("<I", stream.read(4))[0] + (8 if kind == "webp" else 0)
        complete = declared == 0 or declared <= size
    else:
        complete = True
    if not complete:
        raise TruncatedImage(f"the {kind.upper()} file ends before its image does (truncated)")


def _check_limit(name, value, received):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"`{name}` must be a positive int. Received: {name}={received!r}")
    return value


def resolve_limits(max_pixels=None, max_bytes=None):
    """`(max_pixels, max_bytes)`: the given values, or the module's defaults."""
    max_pixels = MAX_PIXELS if max_pixels is None else max_pixels
    max_bytes = MAX_BYTES if max_bytes is None else max_bytes
    return (
        _check_limit("max_pixels", max_pixels, max_pixels),
        _check_limit("max_bytes", max_bytes, max_bytes),
    )


def _jpeg_size(stream):
    """(height, width) from a JPEG's first start-of-frame segment."""
    stream.seek(2)
    while True:
        byte = stream.read(1)
        if not byte:
            raise ValueError("a truncated JPEG header (no frame size before the end)")
        if byte != b"\xff":
            continue
        marker = stream.read(1)
        while marker == b"\xff":  # fill bytes
            marker = stream.read(1)
        if not marker:
            raise ValueError("a truncated JPEG header")
        code = marker[0]
        if code in (0x01, 0xD8) or 0xD0 <= code <= 0xD7:
            continue  # markers without a length
        length_bytes = stream.read(2)
        if len(length_bytes) < 2:
            raise ValueError("a truncated JPEG header")
        (length,) = struct.unpack(">H", length_bytes)
        if code in _JPEG_SOF:
            frame = stream.read(5)
            if len(frame) < 5:
                raise ValueError("a truncated JPEG header")
            _, height, width = struct.unpack(">BHH", frame)
            return height, width
        if code == 0xD9 or length < 2:
            raise ValueError("a JPEG without a frame header")
        stream.seek(length - 2, os.SEEK_CUR)


def _webp_size(head):
    """(height, width) from the first chunk of a WebP (lossy, lossless or extended)."""
    if len(head) < 30:
        raise ValueError("a truncated WebP header")
    chunk = head[12:16]
    if chunk == b"VP8 ":
        width, height = struct.unpack("<HH", head[26:30])
        return height & 0x3FFF, width & 0x3FFF
    if chunk == b"VP8L":
        (bits,) = struct.unpack("<I", head[21:25])
        return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    if chunk == b"VP8X":
        width = int.from_bytes(head[24:27], "little") + 1
        return int.from_bytes(head[27:30], "little") + 1, width
    raise ValueError(f"a WebP without an image chunk (its first chunk is {chunk!r})")


def header_size(stream):
    """`(format, height, width)` read from the header of an encoded image.

    Args:
        stream: a binary file object positioned anywhere (it is sought), or
            bytes.

    Returns:
        `("png" | "gif" | "bmp" | "jpeg" | "webp", height, width)`, the
        size the decoder would allocate (for a GIF, its logical screen; for
        an extended WebP, its canvas).

    Raises:
        ValueError: not a JPEG/PNG/GIF/BMP/WebP header, or a truncated one.

    Example:

    >>> import tensorflow as tf
    >>> header_size(tf.io.encode_png(tf.zeros((3, 5, 1), tf.uint8)).numpy())
    ('png', 3, 5)
    """
    if isinstance(stream, (bytes, bytearray, memoryview)):
        stream = io.BytesIO(bytes(stream))
    stream.seek(0)
    head = stream.read(30)
    if head.startswith(_PNG):
        if len(head) < 24 or head[12:16] != b"IHDR":
            raise ValueError("a truncated PNG header")
        width, height = struct.unpack(">II", head[16:24])
        return "png", height, width
    if head[:6] in (b"GIF87a", b"GIF89a"):
        if len(head) < 10:
            raise ValueError("a truncated GIF header")
        width, height = struct.unpack("<HH", head[6:10])
        return "gif", height, width
    if head.startswith(b"BM"):
        if len(head) < 26:
            raise ValueError("a truncated BMP header")
        width, height = struct.unpack("<ii", head[18:26])
        return "bmp", abs(height), abs(width)
    if head.startswith(b"\xff\xd8\xff"):
        height, width = _jpeg_size(stream)
        return "jpeg", height, width
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return ("webp", *_webp_size(head))
    raise ValueError("not a JPEG/PNG/GIF/BMP/WebP image (its first bytes are none of theirs)")


def check_file(path, max_pixels=None, max_bytes=None):
    """Checks an image file against the limits without decoding it.

    Returns:
        `(height, width)` from its header.

    Raises:
        ImageTooLarge: the file or the image it declares is above a limit.
        TruncatedImage: the file ends before its image does (`check_complete`).
        ValueError: not a readable JPEG/PNG/GIF/BMP/WebP header.
    """
    max_pixels, max_bytes = resolve_limits(max_pixels, max_bytes)
    size = os.path.getsize(path)
    if size > max_bytes:
        raise ImageTooLarge(
            f"the file has {size:,} bytes, above the limit of {max_bytes:,} (max_bytes)"
        )
    with open(path, "rb") as f:
        kind, height, width = header_size(f)
        if height * width > max_pixels:
            raise ImageTooLarge(
                f"the {kind.upper()} declares {width:,} x {height:,} = {width * height:,} "
                f"pixels, above the limit of {max_pixels:,} (max_pixels); refused before decoding"
            )
        check_complete(f, kind, size)
    return height, width


def assert_within_limits(encoded, max_pixels=None, max_bytes=None):
    """A TensorFlow op that fails on encoded bytes above the limits, reading only headers.

    Run it before `tf.io.decode_image` (as a control dependency): for a
    request it raises `InvalidArgumentError` naming the size, so that
    request fails and the next one is answered; nothing is decoded.
    Headers it does not recognise pass (the decoder then refuses the data).

    Args:
        encoded: scalar string tensor, one encoded image.
        max_pixels, max_bytes: the limits (default: the module's).

    Returns:
        The assertion op.
    """
    import tensorflow as tf

    from keras_vit.data.header_bytes import fixed_fields, leading_bytes, signatures_found

    max_pixels, max_bytes = resolve_limits(max_pixels, max_bytes)
    length = tf.strings.length(encoded, unit="BYTE")
    raw = leading_bytes(encoded, 30)
    is_png, is_gif87, is_gif89, is_bmp, is_jpeg, is_webp, is_vp8, is_vp8l, is_vp8x = (
        signatures_found(
            raw,
            [
                {0: _PNG},
                {0: b"GIF87a"},
                {0: b"GIF89a"},
                {0: b"BM"},
                {0: b"\xff\xd8\xff"},
                {0: b"RIFF", 8: b"WEBP"},
                {12: b"VP8 "},
                {12: b"VP8L"},
                {12: b"VP8X"},
            ],
        )
    )
    (
        png_width,
        png_height,
        gif_width,
        gif_height,
        bmp_width,
        bmp_height,
        vp8_width,
        vp8_height,
        vp8l_bits,
        vp8x_width,
        vp8x_height,
    ) = fixed_fields(
        raw,
        [
            (16, 4, "big"),
            (20, 4, "big"),
            (6, 2, "little"),
            (8, 2, "little"),
            (18, 4, "little"),
            (22, 4, "little"),
            (26, 2, "little"),
            (28, 2, "little"),
            (21, 4, "little"),
            (24, 3, "little"),
            (27, 3, "little"),
        ],
    )

    zero = tf.constant(0, tf.int64)

    def signed32(value):
        return tf.abs(tf.where(value >= 2**31, value - 2**32, value))

    def jpeg_pixels():
        shape = tf.cast(tf.image.extract_jpeg_shape(encoded), tf.int64)
        return shape[0] * shape[1]

    # Each side at most 2**31 (a PNG's may be 2**32 - 1): no int64 overflow.
    declared = {
        "png": tf.minimum(png_width, 2**31) * tf.minimum(png_height, 2**31),
        "gif": gif_width * gif_height,
        "bmp": signed32(bmp_width) * signed32(bmp_height),
        "jpeg": tf.cond(is_jpeg, jpeg_pixels, lambda: zero),
        # As `_webp_size`.
        "webp": tf.where(is_vp8, (vp8_width % 2**14) * (vp8_height % 2**14), zero)
        + tf.where(is_vp8l, (vp8l_bits % 2**14 + 1) * (vp8l_bits // 2**14 % 2**14 + 1), zero)
        + tf.where(is_vp8x, (vp8x_width + 1) * (vp8x_height + 1), zero),
    }
    kinds = {
        "png": is_png,
        "gif": is_gif87 | is_gif89,
        "bmp": is_bmp,
        "jpeg": is_jpeg,
        "webp": is_webp,
    }
    # The signatures exclude each other: at most one term is not zero.
    pixels = tf.add_n([tf.where(kinds[kind], declared[kind], zero) for kind in kinds])
    return tf.group(
        tf.debugging.assert_less_equal(
            length,
            tf.constant(max_bytes, length.dtype),
            message=f"image refused: more bytes than the limit of {max_bytes:,} (max_bytes)",
        ),
        tf.debugging.assert_less_equal(
            pixels,
            tf.constant(max_pixels, tf.int64),
            message=f"image refused before decoding: its header declares more pixels than "
            f"the limit of {max_pixels:,} (max_pixels)",
        ),
    )
