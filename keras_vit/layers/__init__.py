"""Keras layers of the Vision Transformer; `keras.ops` only, every backend."""

from keras_vit.layers.attention_pooling import AttentionPooling
from keras_vit.layers.batch_normalization import BatchNormalization
from keras_vit.layers.class_token import ClassToken
from keras_vit.layers.conv_stem import ConvStem
from keras_vit.layers.fake_quantization import ActivationQuantizer
from keras_vit.layers.gelu_dense import GeluDense, QuantizationAwareDense, SwiGLUDense
from keras_vit.layers.layer_normalization import LayerNormalization
from keras_vit.layers.layer_scale import LayerScale
from keras_vit.layers.multi_head_self_attention import MultiHeadSelfAttention
from keras_vit.layers.patch_corruption import PatchCorruption
from keras_vit.layers.patch_dropout import PatchDropout
from keras_vit.layers.patch_embedding import PatchEmbedding, patch_grid
from keras_vit.layers.position_embedding import (
    PositionEmbedding,
    resample_position_embeddings,
    sincos_2d_position_embeddings,
)
from keras_vit.layers.projection import Projection
from keras_vit.layers.register_tokens import RegisterTokens
from keras_vit.layers.restore_masked_tokens import RestoreMaskedTokens
from keras_vit.layers.rotary_position_embedding import RotaryPositionEmbedding2D
from keras_vit.layers.select_tokens import SelectTokens
from keras_vit.layers.stochastic_depth import StochasticDepth
from keras_vit.layers.token_merging_block import TokenMergingBlock, bipartite_merge
from keras_vit.layers.token_pooling import TokenPooling
from keras_vit.layers.transformer_block import TransformerBlock

__all__ = [
    "ActivationQuantizer",
    "AttentionPooling",
    "BatchNormalization",
    "ClassToken",
    "ConvStem",
    "GeluDense",
    "LayerNormalization",
    "LayerScale",
    "MultiHeadSelfAttention",
    "PatchCorruption",
    "PatchDropout",
    "PatchEmbedding",
    "PositionEmbedding",
    "Projection",
    "QuantizationAwareDense",
    "RegisterTokens",
    "RestoreMaskedTokens",
    "RotaryPositionEmbedding2D",
    "SelectTokens",
    "StochasticDepth",
    "SwiGLUDense",
    "TokenMergingBlock",
    "TokenPooling",
    "TransformerBlock",
    "bipartite_merge",
    "patch_grid",
    "resample_position_embeddings",
    "sincos_2d_position_embeddings",
]
