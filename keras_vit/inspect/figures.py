"""Matplotlib figures over the arrays of `keras_vit.inspect.maps`.

Each function returns a `matplotlib.figure.Figure` (headless: the Agg
backend); `save(figure, path)` writes it as a PNG.
"""

import numpy as np


def _figure(rows, cols, size=2.0):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(rows, cols, figsize=(cols * size, rows * size), squeeze=False)
    for axis in axes.ravel():
        axis.set_xticks([])
        axis.set_yticks([])
    return figure, axes


def _display(image):
    image = np.asarray(image, "float32")
    image = (image - image.min()) / max(float(image.max() - image.min()), 1e-12)
    return image[..., 0] if image.shape[-1] == 1 else image


def rollout_overlay(images, rollouts, titles=None):
    """Each image beside its attention rollout, upsampled and laid over it."""
    import keras

    figure, axes = _figure(len(images), 2, size=2.5)
    for row, (image, rollout) in enumerate(zip(images, rollouts)):
        shown = _display(image)
        heat = keras.ops.convert_to_numpy(
            keras.ops.image.resize(
                np.asarray(rollout, "float32")[..., None],
                shown.shape[:2],
                interpolation="bilinear",
            )
        )[..., 0]
        cmap = "gray" if shown.ndim == 2 else None
        axes[row, 0].imshow(shown, cmap=cmap)
        axes[row, 1].imshow(shown, cmap=cmap)
        axes[row, 1].imshow(heat, cmap="inferno", alpha=0.6)
        if titles is not None:
            axes[row, 0].set_title(titles[row], fontsize=9)
        axes[row, 1].set_title("attention rollout", fontsize=9)
    figure.tight_layout()
    return figure


def attention_distance_plot(distances, image_size=None, patch_size=None, uniform=None):
    """Mean attention distance of every head against depth (paper Fig. 7, right).

    One colour per head (the same head index keeps its colour from layer
    to layer), integer layer ticks counted from 1, the legend outside the
    axes so it hides no point, the y axis in pixels of the input image.

    Args:
        distances: `(layers, heads)` array in pixels.
        image_size: optional `(height, width)` of the input, named on the axis.
        patch_size: optional `(height, width)` of a patch, named in the title.
        uniform: optional distance of uniform attention over the grid,
            drawn as a dashed reference line (heads near it attend globally).
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    distances = np.asarray(distances)
    layers, heads = distances.shape
    figure, axis = plt.subplots(figsize=(5.6, 3.6))
    colours = plt.get_cmap("tab20" if heads > 10 else "tab10")
    depth = np.arange(1, layers + 1)
    for head in range(heads):
        axis.scatter(
            depth,
            distances[:, head],
            s=18,
            color=colours(head % colours.N),
            label=f"head {head + 1}",
            zorder=2,
        )
    if layers <= 24:
        axis.set_xticks(depth)
    else:
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlim(0.5, layers + 0.5)
    top = max(float(distances.max()), uniform or 0.0)
    axis.set_ylim(0, top * 1.1)
    if uniform is not None:
        axis.axhline(
            uniform, color="0.4", linestyle="--", linewidth=1, zorder=1, label="uniform attention"
        )
    axis.grid(True, alpha=0.3, zorder=0)
    axis.set_xlabel("network depth (layer)")
    unit = (
        "pixels"
        if image_size is None
        else f"pixels of the {image_size[1]}\u00d7{image_size[0]} image"
    )
    axis.set_ylabel(f"mean attention distance\n({unit})")
    if patch_size is not None:
        axis.set_title(
            f"{heads} heads a layer, {patch_size[1]}\u00d7{patch_size[0]}-pixel patches", fontsize=9
        )
    axis.legend(
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        frameon=False,
        ncol=1 if heads <= 16 else 2,
    )
    figure.tight_layout()
    return figure


def position_similarity_grid(similarity):
    """One small similarity map per position, laid out like the grid (paper Fig. 10)."""
    rows, cols = similarity.shape[:2]
    figure, axes = _figure(rows, cols, size=0.8)
    for i in range(rows):
        for j in range(cols):
            axes[i, j].imshow(similarity[i, j], cmap="viridis", vmin=-1, vmax=1)
    figure.suptitle("position embedding similarity")
    return figure


def embedding_filter_grid(filters, columns=7):
    """The principal components of the patch filters as images (paper Fig. 7, left)."""
    rows = int(np.ceil(len(filters) / columns))
    figure, axes = _figure(rows, columns, size=0.8)
    for index, component in enumerate(filters):
        axes.ravel()[index].imshow(
            _display(component), cmap="gray" if component.shape[-1] == 1 else None
        )
    for axis in axes.ravel()[len(filters) :]:
        axis.set_visible(False)  # a last row with fewer components: no empty frames
    figure.suptitle("patch embedding filters (principal components)")
    return figure


def save(figure, path):
    """Writes `figure` as a PNG and closes it."""
    from matplotlib import pyplot as plt

    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
