"""Inspecting a ViT (paper section 4.5): attention, distances, embeddings.

```python
from keras_vit import inspect as vit_inspect

attention = vit_inspect.attention_maps(model, images)      # (layers, B, heads, T, T)
prefix, grid, patch = vit_inspect.token_layout(model)
heat = vit_inspect.attention_rollout(attention, prefix, grid)
distance = vit_inspect.mean_attention_distance(attention, grid, patch, prefix)
```
"""

from keras_vit.inspect.figures import (
    attention_distance_plot,
    embedding_filter_grid,
    position_similarity_grid,
    rollout_overlay,
    save,
)
from keras_vit.inspect.maps import (
    attention_maps,
    attention_rollout,
    block_inputs_model,
    embedding_filters,
    has_stem,
    mean_attention_distance,
    patch_distances,
    position_similarity,
    token_layout,
    uniform_attention_distance,
)


def write_figures(model, images, out_dir, titles=None):
    """Writes the figures of section 4.5 for `model` on `images` as PNGs.

    Attention rollout over the images, mean attention distance per head and
    layer, position-embedding similarity and (without a convolutional stem)
    the patch filters' principal components.

    Returns:
        dict of figure name -> path.
    """
    import os

    os.makedirs(out_dir, exist_ok=True)
    prefix, grid, patch = token_layout(model, images.shape[1:3])
    attention = attention_maps(model, images)
    paths = {
        "attention_rollout": rollout_overlay(
            images, attention_rollout(attention, prefix, grid), titles
        ),
        "attention_distance": attention_distance_plot(
            mean_attention_distance(attention, grid, patch, prefix),
            image_size=tuple(images.shape[1:3]),
            patch_size=patch,
            uniform=uniform_attention_distance(grid, patch),
        ),
        "position_similarity": position_similarity_grid(position_similarity(model)),
    }
    if not has_stem(model):  # only then do the patch filters act on pixels
        paths["embedding_filters"] = embedding_filter_grid(embedding_filters(model))
    return {
        name: save(figure, os.path.join(out_dir, f"{name}.png")) for name, figure in paths.items()
    }
