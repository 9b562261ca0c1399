"""What the data pipeline computes for self-supervision: plans and targets.

These run inside `tf.data` (TensorFlow ops, as `keras_vit.data`), on
batches of float `[0, 255]` images `(batch, height, width, channels)`,
with stateless random ops: the same seed gives the same masks on every
backend and after a resume. Patches are numbered row by row, as
`PatchEmbedding` orders its tokens, and a patch's pixels are flattened
`(row, column, channel)`, as MAE's `patchify`.
"""

import numpy as np


def patchify(images, patch_size):
    """`(batch, height, width, C)` images as `(batch, patches, ph * pw * C)` rows."""
    import tensorflow as tf

    ph, pw = patch_size
    shape = tf.shape(images)
    rows, cols, channels = images.shape[1] // ph, images.shape[2] // pw, images.shape[3]
    x = tf.reshape(images, (shape[0], rows, ph, cols, pw, channels))
    x = tf.transpose(x, (0, 1, 3, 2, 4, 5))
    return tf.reshape(x, (shape[0], rows * cols, ph * pw * channels))


def quantized_colors(images, patch_size, bits=3, grid=1):
    """The paper's colour classes: each patch's mean colour, `bits` bits a channel.

    Each patch is split into a `grid x grid` grid of cells (1: the whole
    patch); each cell's mean pixel is quantised to `2**bits` levels per
    channel (`floor(mean * 2**bits / 256)`) and the levels are read as one
    number, red most significant: with 3 bits, RGB gives `8**3 = 512`
    classes and a grey image 8.

    Returns:
        int32 `(batch, patches)` classes for `grid=1`, else
        `(batch, patches, grid * grid)` with the cells row by row.
    """
    import tensorflow as tf

    ph, pw = patch_size
    cell = (ph // grid, pw // grid)
    means = tf.nn.avg_pool2d(images, cell, cell, "VALID")  # (B, rows*grid, cols*grid, C)
    levels = tf.clip_by_value(tf.floor(means * (2**bits) / 256.0), 0.0, 2.0**bits - 1.0)
    channels = images.shape[-1]
    place = (2**bits) ** np.arange(channels - 1, -1, -1)
    classes = tf.cast(tf.reduce_sum(levels * place.astype("float32"), axis=-1), tf.int32)
    cells = patchify(classes[..., None], (grid, grid))  # (B, patches, grid*grid)
    return cells[..., 0] if grid == 1 else cells


def normalized_patch_pixels(images, patch_size, epsilon=1e-6):
    """MAE's targets: each patch's pixels minus their mean over their (unbiased) std.

    Computed on `[0, 1]` pixels, as `(x - mean) / sqrt(var + epsilon)` with
    the variance over the patch's `ph * pw * C` values and `n - 1` in the
    denominator (He et al. 2021's `norm_pix_loss`).
    """
    import tensorflow as tf

    patches = patchify(images / 255.0, patch_size)
    mean = tf.reduce_mean(patches, axis=-1, keepdims=True)
    count = tf.cast(tf.shape(patches)[-1], patches.dtype)
    variance = tf.reduce_sum(tf.square(patches - mean), -1, keepdims=True) / (count - 1.0)
    return (patches - mean) / tf.sqrt(variance + epsilon)


def scaled_patch_pixels(images, patch_size):
    """Each patch's pixels in `[-1, 1]`, `(batch, patches, ph * pw * C)`."""
    return patchify(images / 127.5 - 1.0, patch_size)


def corruption_plan(
    seed, batch_size, num_patches, rate=0.5, mask_fraction=0.8, replace_fraction=0.1
):
    """Which patch embeddings are corrupted, and how (BERT's recipe, the paper's).

    Exactly `round(rate * num_patches)` patches of every image are chosen
    uniformly; each chosen one independently becomes `[mask]` with
    probability `mask_fraction`, the embedding of another patch of the same
    image (uniform over the others) with probability `replace_fraction`,
    and stays as it is otherwise. Only chosen patches are predicted.

    Args:
        seed: int `(2,)` tensor, the stateless seed.

    Returns:
        `(chosen, mask, source)`: float32 `(batch, patches)` 1 for patches
        to predict; int32 1 for patches that become `[mask]`; int32 the
        patch whose embedding each position receives.
    """
    import tensorflow as tf

    seeds = tf.random.experimental.stateless_split(seed, 3)
    shape = tf.stack([batch_size, num_patches])
    ranks = tf.argsort(tf.argsort(tf.random.stateless_uniform(shape, seeds[0]), axis=1), axis=1)
    chosen = ranks < int(round(rate * num_patches))
    kind = tf.random.stateless_uniform(shape, seeds[1])
    mask = chosen & (kind < mask_fraction)
    replace = chosen & (kind >= mask_fraction) & (kind < mask_fraction + replace_fraction)
    own = tf.range(num_patches, dtype=tf.int32)[None]
    offset = tf.random.stateless_uniform(shape, seeds[2], 1, num_patches, dtype=tf.int32)
    source = tf.where(replace, (own + offset) % num_patches, own)
    return tf.cast(chosen, tf.float32), tf.cast(mask, tf.int32), source


def keep_plan(seed, batch_size, num_patches, mask_ratio=0.75):
    """MAE's random masking: which patches the encoder sees, and how to undo it.

    A uniform random permutation per image; its first
    `int(num_patches * (1 - mask_ratio))` entries are the kept patches.

    Returns:
        `(kept, restore, masked)`: int32 `(batch, kept)` kept patch indices;
        int32 `(batch, patches)` each patch's place in "kept, then dropped";
        float32 `(batch, patches)` 1 for dropped (predicted) patches.
    """
    import tensorflow as tf

    noise = tf.random.stateless_uniform(tf.stack([batch_size, num_patches]), seed)
    shuffle = tf.argsort(noise, axis=1, stable=True)
    restore = tf.argsort(shuffle, axis=1, stable=True)
    count = int(num_patches * (1 - mask_ratio))
    masked = tf.cast(restore >= count, tf.float32)
    return shuffle[:, :count], restore, masked
