"""Photos the right way up: the EXIF orientation read by TensorFlow ops,
applied wherever images are decoded."""

import io
import struct

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageOps

from keras_vit.data import decode_upright, from_folder
from keras_vit.data.orientation import exif_orientation
from keras_vit.data.pipeline import decode_for_eval

# TensorFlow ops only: the same under every backend.
pytestmark = pytest.mark.backend_independent

# What each value of the EXIF Orientation tag asks of the stored image.
TURNS = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),  # 90 degrees clockwise
    7: lambda a: a.transpose(1, 0, 2)[::-1, ::-1],
    8: lambda a: np.rot90(a, 1),  # 90 degrees anticlockwise
}


def photo():
    """A 16 x 24 JPEG of six flat blocks: every turn and mirror of it differs."""
    grid = np.array([[0, 80, 160], [40, 120, 200]], "uint8")
    pixels = np.kron(grid, np.ones((8, 8), "uint8"))[..., None].repeat(3, axis=-1)
    return tf.io.encode_jpeg(pixels, quality=95).numpy()


def with_exif(jpeg, orientation, byte_order="<", after_jfif=False, tag=0x0112):
    """`jpeg` with an EXIF segment whose IFD0 holds a camera make, then `Orientation`."""
    entries = [
        struct.pack(byte_order + "HHI4s", 0x010F, 2, 4, b"Cam\0"),
        struct.pack(byte_order + "HHIH2x", tag, 3, 1, orientation),
    ]
    tiff = (
        (b"II" if byte_order == "<" else b"MM")
        + struct.pack(byte_order + "HI", 42, 8)
        + struct.pack(byte_order + "H", len(entries))
        + b"".join(entries)
        + struct.pack(byte_order + "I", 0)
    )
    payload = b"Exif\0\0" + tiff
    segment = b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload
    at = 2
    if after_jfif:
        assert jpeg[2:4] == b"\xff\xe0"  # TensorFlow writes a JFIF segment first
        at = 4 + struct.unpack(">H", jpeg[4:6])[0]
    return jpeg[:at] + segment + jpeg[at:]


@pytest.mark.parametrize("byte_order", ["<", ">"])
@pytest.mark.parametrize("after_jfif", [False, True])
def test_the_orientation_is_read_in_either_byte_order_wherever_the_segment_is(
    byte_order, after_jfif
):
    for orientation in range(1, 9):
        encoded = with_exif(photo(), orientation, byte_order, after_jfif)
        assert int(exif_orientation(tf.constant(encoded))) == orientation


def test_images_without_a_usable_orientation_stay_as_they_are():
    jpeg = photo()
    png = tf.io.encode_png(tf.zeros((4, 6, 3), tf.uint8)).numpy()
    exif_six = with_exif(jpeg, 6)
    for encoded in (
        jpeg,
        png,
        with_exif(jpeg, 9),
        with_exif(jpeg, 0),
        with_exif(jpeg, 6, tag=0x0110),  # another tag with 6
        exif_six[:30] + exif_six[60:],
    ):  # a segment cut short
        assert int(exif_orientation(tf.constant(encoded))) == 1


def test_decoding_turns_each_orientation_as_the_standard_and_pil_do():
    jpeg = photo()
    stored = tf.io.decode_jpeg(jpeg).numpy()
    for orientation, turn in TURNS.items():
        encoded = with_exif(jpeg, orientation)
        ours = decode_upright(tf.constant(encoded)).numpy()
        np.testing.assert_array_equal(ours, turn(stored))  # the same decoder, turned
        # PIL, the reference: its decoder rounds a little differently.
        pil = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(encoded))))
        assert pil.shape == ours.shape, orientation
        assert np.abs(pil.astype(int) - ours).mean() < 2, orientation


def test_folders_and_the_evaluation_view_see_photos_upright(tmp_path):
    # The same picture twice: a JPEG stored sideways with orientation 6, and
    # a PNG of the upright pixels.
    jpeg = photo()
    upright = TURNS[6](tf.io.decode_jpeg(jpeg).numpy())
    for name, data in (("sideways", with_exif(jpeg, 6)), ("upright", None)):
        folder = tmp_path / name / "photos"
        folder.mkdir(parents=True)
        if data is None:
            (folder / "a.png").write_bytes(tf.io.encode_png(np.ascontiguousarray(upright)).numpy())
        else:
            (folder / "a.jpg").write_bytes(data)
    views = []
    for name in ("sideways", "upright"):
        data = from_folder(str(tmp_path / name), image_size=(24, 16), batch_size=1)
        views.append(next(iter(data.data))[0].numpy())
    np.testing.assert_allclose(views[0], views[1])
    encoded = tf.io.encode_png(np.ascontiguousarray(upright)).numpy()
    np.testing.assert_allclose(
        decode_for_eval(tf.constant(with_exif(jpeg, 6)), (20, 12)),
        decode_for_eval(tf.constant(encoded), (20, 12)),
    )
