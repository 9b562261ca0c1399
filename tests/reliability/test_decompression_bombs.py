"""Images that declare more pixels than the limits are refused from their headers, never decoded."""

import io
import json
import os
import resource
import struct
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import keras_vit
from keras_vit.data import image_limits
from keras_vit.data import pipeline as vit_pipelines
from tests import warm_interpreters
from tests.bombs import gif_bomb, jpeg_bomb, png_bomb, webp_bomb
from tests.conftest import BACKEND, TINY
from tests.test_console import console_environment

# 64 KB that TensorFlow's decoder turns into 529 million pixels: 8.9 GB at the
# peak on the way to a 224x224 RGB input (benchmarks/decompression_bombs.py).
PNG_BOMB = png_bomb(23000, 23000)


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def webp(pixels, **options):
    """WebP bytes from PIL (libwebp): lossy, or `lossless=True`."""
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "WEBP", **options)
    return out.getvalue()


def small_images():
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (13, 21, 3)).astype("uint8")
    return {
        "png": tf.io.encode_png(pixels).numpy(),
        "jpeg": tf.io.encode_jpeg(pixels).numpy(),
        "gif": gif_bomb(21, 13),
        "bmp": b"BM"
        + bytes(16)
        + (21).to_bytes(4, "little")
        + (-13).to_bytes(4, "little", signed=True),
        "webp": webp(pixels),
        "webp lossless": webp(pixels, lossless=True),
        "webp extended": webp(np.dstack([pixels, pixels[..., :1]]), exact=True),  # with alpha: VP8X
    }


@pytest.mark.backend_independent  # file bytes alone
@pytest.mark.parametrize("kind", ["PNG", "JPEG", "WEBP", "BMP", "GIF"])
def test_a_truncated_image_is_found_from_its_bytes_and_a_complete_one_passes(tmp_path, kind):
    image = np.random.default_rng(0).integers(0, 256, (40, 50, 3)).astype("uint8")
    encoded = io.BytesIO()
    Image.fromarray(image).save(encoded, kind)
    whole = encoded.getvalue()
    cases = {
        "whole": whole,
        # Data after the image's end (a motion photo's video after its JPEG).
        "trailer": whole + b"\x00" * 4096 + b"ftypmp42",
        "cut": whole[: len(whole) * 2 // 3],
        "cut_early": whole[: len(whole) // 4],
    }
    if kind == "GIF":
        # The decoder needs the first frame only: an animation cut in a later
        # frame (here after a long comment), or without its trailer, decodes.
        frames = [Image.fromarray(image), Image.fromarray(image[::-1])]
        animation = io.BytesIO()
        frames[0].save(animation, kind, save_all=True, append_images=frames[1:], comment=b"x" * 600)
        animation = animation.getvalue()
        cases["no_trailer"] = whole[:-1]
        cases["animation_cut_in_frame_2"] = animation[: len(animation) - 100]
        second_frame_cut = tf.io.decode_image(
            cases["animation_cut_in_frame_2"], expand_animations=False
        )
        assert second_frame_cut.shape == (40, 50, 3)
    for name, data in cases.items():
        path = tmp_path / f"{name}.{kind.lower()}"
        path.write_bytes(data)
        if name.startswith("cut"):
            with pytest.raises(image_limits.TruncatedImage, match=f"the {kind} file ends before"):
                image_limits.check_file(str(path))
            with pytest.raises(tf.errors.InvalidArgumentError):  # what decoding would do
                tf.io.decode_image(data)
        else:
            assert image_limits.check_file(str(path)) == (40, 50), name


@pytest.mark.backend_independent  # keras_vit.data: tf.data alone
def test_header_sizes_are_read_without_decoding():
    images = small_images()
    assert [images[k][12:16] for k in ("webp", "webp lossless", "webp extended")] == [
        b"VP8 ",
        b"VP8L",
        b"VP8X",
    ]  # each kind of WebP header
    for kind, data in images.items():
        assert image_limits.header_size(data) == (kind.split()[0], 13, 21), kind
    assert image_limits.header_size(webp_bomb(40000, 30000)) == ("webp", 30000, 40000)
    jpeg = small_images()["jpeg"]
    assert image_limits.header_size(jpeg_bomb(jpeg, 40000, 30000)) == ("jpeg", 30000, 40000)
    assert image_limits.header_size(PNG_BOMB) == ("png", 23000, 23000)
    for data, cause in (
        (b"hello", "not a JPEG/PNG/GIF/BMP/WebP"),
        (PNG_BOMB[:20], "truncated PNG"),
        (jpeg[:20], "truncated JPEG"),
    ):
        with pytest.raises(ValueError, match=cause):
            image_limits.header_size(data)


@pytest.mark.backend_independent  # keras_vit.data: tf.data alone
def test_the_graph_check_refuses_bombs_and_passes_ordinary_images():
    jpeg = small_images()["jpeg"]
    for bomb in (
        PNG_BOMB,
        gif_bomb(30000, 30000),
        jpeg_bomb(jpeg, 30000, 30000),
        webp_bomb(30000, 30000),
    ):
        before = peak_rss_mb()
        with pytest.raises(tf.errors.InvalidArgumentError, match="refused before decoding"):
            vit_pipelines.decode_for_eval(tf.constant(bomb), (16, 16), 3)
        assert peak_rss_mb() - before < 200
    for data in small_images().values():
        image_limits.assert_within_limits(tf.constant(data))  # no error
        # Exactly at the limit passes, one pixel below it is refused: the sizes are read right.
        image_limits.assert_within_limits(tf.constant(data), max_pixels=273)
        with pytest.raises(tf.errors.InvalidArgumentError, match="272"):
            image_limits.assert_within_limits(tf.constant(data), max_pixels=272)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_bytes"):
        image_limits.assert_within_limits(tf.constant(small_images()["png"]), max_bytes=100)
    # A PNG's sides are 32-bit: their product passes 2**63 and must not wrap around.
    huge = bytearray(small_images()["png"])
    huge[16:24] = struct.pack(">II", 2**32 - 1, 2**32 - 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="refused before decoding"):
        image_limits.assert_within_limits(tf.constant(bytes(huge)))
    # The limit is the caller's to raise: 13 x 21 = 273 pixels.
    with pytest.raises(tf.errors.InvalidArgumentError, match="272"):
        vit_pipelines.decode_for_eval(tf.constant(small_images()["png"]), (8, 8), max_pixels=272)
    assert vit_pipelines.decode_for_eval(
        tf.constant(small_images()["png"]), (8, 8), max_pixels=273
    ).shape == (8, 8, 3)


@pytest.mark.backend_independent  # keras_vit.data: tf.data alone
def test_a_folders_traced_decoder_is_shared_per_setting_and_keeps_each_settings_limits(tmp_path):
    # Every pipeline of a process calls one traced decoder per setting; a
    # pipeline with other limits (or channels) gets its own, checking its limits.
    path = tmp_path / "image.png"
    path.write_bytes(small_images()["png"])  # 13 x 21 = 273 pixels
    bytes_limit = image_limits.MAX_BYTES
    assert vit_pipelines.file_decoder(273, bytes_limit, 3) is vit_pipelines.file_decoder(
        273, bytes_limit, 3
    )
    assert vit_pipelines.file_decoder(273, bytes_limit, 3)(str(path)).shape == (13, 21, 3)
    assert vit_pipelines.file_decoder(273, bytes_limit, 1)(str(path)).shape == (13, 21, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="272"):
        vit_pipelines.file_decoder(272, bytes_limit, 3)(str(path))


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "big"])
@pytest.mark.backend_independent  # keras_vit.data: tf.data alone
def test_bad_limits_are_refused_by_name(value):
    with pytest.raises(ValueError, match=f"max_pixels={value!r}"):
        image_limits.resolve_limits(max_pixels=value)


@pytest.mark.backend_independent  # keras_vit.data: tf.data alone
def test_an_image_folder_skips_a_bomb_with_one_warning(tmp_path, caplog):
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        os.makedirs(tmp_path / name)
        for i in range(3):
            pixels = rng.integers(0, 256, (12, 12, 3)).astype("uint8")
            (tmp_path / name / f"{i}.png").write_bytes(tf.io.encode_png(pixels).numpy())
    (tmp_path / "a" / "bomb.png").write_bytes(PNG_BOMB)
    (tmp_path / "b" / "notes.txt").write_text("not an image")
    before = peak_rss_mb()
    with caplog.at_level("WARNING", logger="keras_vit"):
        dataset = keras_vit.data.from_folder(str(tmp_path), image_size=8, batch_size=4)
    images = np.concatenate([x.numpy() for x, _ in dataset.data])
    assert len(images) == 6 and dataset.size == 6
    warnings = [r.getMessage() for r in caplog.records if r.name == "keras_vit"]
    assert len(warnings) == 1, warnings
    assert "1 file(s) that are not JPEG/PNG/GIF/BMP/WebP images" in warnings[0]
    assert "1 image(s) above the size limits" in warnings[0]
    assert peak_rss_mb() - before < 200


@pytest.mark.skipif(
    BACKEND == "torch",
    reason="the serving graph is traced on TensorFlow or JAX; "
    "torch models are exported through rebuild_on_tensorflow (tests/export)",
)
@pytest.mark.slow
def test_a_served_bomb_fails_its_request_and_the_next_one_is_answered(tmp_path):
    model = keras_vit.ViT(**TINY)
    path = keras_vit.export.saved_model(model, str(tmp_path / "serving"), warmup=False)
    serve = tf.saved_model.load(path).signatures["serving_bytes"]
    good = small_images()["png"]
    before = peak_rss_mb()
    with pytest.raises(tf.errors.InvalidArgumentError, match="refused before decoding"):
        serve(image_bytes=tf.constant([good, PNG_BOMB]))
    assert peak_rss_mb() - before < 200
    assert serve(image_bytes=tf.constant([good]))["probabilities"].shape == (1, TINY["classes"])
    with open(os.path.join(path, "assets.extra", "keras_vit.json")) as f:
        metadata = json.load(f)
    assert metadata["max_image_pixels"] == image_limits.MAX_PIXELS


@pytest.mark.slow
def test_predict_names_each_bad_files_cause_and_answers_for_the_rest(tmp_path):
    model = keras_vit.ViT(**TINY, name="tiny")
    model.save(tmp_path / "model.keras")
    files = {
        "good.png": tf.io.encode_png(np.zeros((20, 30, 3), "uint8")).numpy(),
        "tiny.png": tf.io.encode_png(np.zeros((1, 1, 3), "uint8")).numpy(),
        "bomb.png": PNG_BOMB,
        "truncated.png": small_images()["png"][:60],
        "text.png": b"just some text",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    command = [
        sys.executable,
        "-m",
        "keras_vit_launcher",
        "predict",
        *[str(tmp_path / name) for name in files],
        "--model",
        str(tmp_path / "model.keras"),
    ]
    # (The libraries' quiet start is tests/test_console.py's: their log level is set.)
    done = warm_interpreters.run(
        command,
        capture_output=True,
        text=True,
        timeout=900,
        env=console_environment(TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert done.returncode == 1, done.stderr
    answered = [line for line in done.stdout.splitlines() if not line.startswith(" ")]
    assert answered == [str(tmp_path / "good.png"), str(tmp_path / "tiny.png")], done.stdout
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 4, done.stderr
    assert "tiny.png: warning: 1x1 image upscaled to the model's 16x16" in errors[0]
    assert (
        "bomb.png: the PNG declares 23,000 x 23,000 = 529,000,000 pixels, above the "
        "limit of 64,000,000" in errors[1]
    )
    assert "truncated.png: the PNG file ends before its image does (truncated)" in errors[2]
    assert "text.png: not a JPEG/PNG/GIF/BMP/WebP image" in errors[3]
