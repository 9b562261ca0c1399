"""Decompression bombs: small files whose headers declare huge images.

Valid as far as their headers go (the PNG is complete and decodes), so a
decoder that trusts them allocates the whole declared image.
"""

import struct
import zlib


def _png_chunk(kind, data):
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def png_bomb(width, height, bit_depth=1):
    """A complete grey PNG of all-zero pixels: ~109 KB for 30,000 x 30,000 1-bit pixels."""
    row = b"\0" * (1 + (width * bit_depth + 7) // 8)  # filter byte + packed pixels
    compressor = zlib.compressobj(9)
    data = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, bit_depth, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", data)
        + _png_chunk(b"IEND", b"")
    )


def gif_bomb(width, height):
    """35 bytes: a GIF whose logical screen is `width` x `height`, with one 1x1 frame."""
    screen = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\0\0\0\xff\xff\xff"
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    return screen + frame + b"\x3b"


def jpeg_bomb(small_jpeg, width, height):
    """A small JPEG whose frame header is rewritten to declare `width` x `height`."""
    data = bytearray(small_jpeg)
    index = 2
    while index < len(data):
        marker, length = data[index + 1], struct.unpack(">H", data[index + 2 : index + 4])[0]
        if marker in (0xC0, 0xC1, 0xC2):
            data[index + 5 : index + 9] = struct.pack(">HH", height, width)
            return bytes(data)
        index += 2 + length
    raise ValueError("no start-of-frame marker")


def webp_bomb(width, height):
    """An extended WebP (VP8X) whose canvas is `width` x `height` (up to 2^24 each), 30 bytes."""
    canvas = (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    chunk = b"VP8X" + struct.pack("<I", 10) + b"\0\0\0\0" + canvas
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk
