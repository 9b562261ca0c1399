"""The Vision Transformer as a functional Keras model, assembled from its parts."""

import inspect
import types
import warnings

import keras

from keras_vit import _compat
from keras_vit import layers as vit_layers
from keras_vit.models import layouts, lora
from keras_vit.models import parts as model_parts
from keras_vit.models.parts import (
    Encoder,
    Head,
    ImageInput,
    Patches,
    Positions,
    TokenLayout,
)


@keras.saving.register_keras_serializable(package="keras_vit")
class VisionTransformer(keras.Model):
    """A Vision Transformer (Dosovitskiy et al. 2020): a functional Keras model.

    Assembled from its parts (`keras_vit.models.parts`), each a small
    checked dataclass that makes its stage's layers: the images come in
    (`ImageInput`: shape, layout, pixel normalisation), are cut into patch
    tokens (`Patches`: patch size, optional convolutional stem), learned
    tokens are prepended (`TokenLayout`: class, distillation, registers),
    positions are told (`Positions`: a learned or sin-cos table and how it
    resamples, or rotations of every attention's queries and keys), the
    pre-norm Transformer blocks and a final LayerNorm follow (`Encoder`),
    then pooling and the classifier (`Head`). Layers are named
    after the reference implementation: `patch_embedding`, `class_token`,
    `position_embedding`, `encoderblock_{i}`, `encoder_norm`, `pooling`,
    `pre_logits`, `head`.

    The constructor builds the layers and reads nothing. The flat arguments
    that the builders take (`keras_vit.ViT(patch_size=4, hidden_dim=32,
    ...)`, `ViTB16(...)`), `from_arguments` and `get_config` are the parts'
    fields under their names (`parts.ARGUMENTS`); the builders and
    `keras_vit.from_checkpoint` also load checkpoints (`weights=`).

    Args:
        encoder: an `Encoder` (width, depth, heads, MLP width, GELU form,
            LayerNorm epsilon, LayerScale, dropouts, remat); `None`: ViT-B's.
        image: an `ImageInput`; `None`: `(224, 224, 3)` pixels in `[0, 255]`
            normalised to `[-1, 1]`, in `keras.config.image_data_format()`.
        patches: a `Patches`; `None`: 16×16 patches of pixels.
        tokens: a `TokenLayout`; `None`: a class token.
        positions: a `Positions`; `None`: a learned table, bicubic resampling.
        head: a `Head`; `None`: the class token's output, a 1000-class
            zero-initialised softmax classifier.
        qat: `None`, `"int8"` or `"int8_full"`: quantization-aware training
            for LiteRT. The model computes with the rounding that
            `keras_vit.export.tflite(..., quantization=qat)` will apply, and
            its LayerNorms only normalise (their scale and offset folded into
            the layers that read them). Made from a float model by
            `keras_vit.models.quantization_aware_copy`; needs the plain
            layout: no stem, LayerScale, `pre_logits`, distillation token or
            attention pooling.
        input_tensor: optional Keras tensor (`keras.Input(...)`) to use as
            the image input.
        name: str, the model's name.
        trainable: bool, whether the model's weights are trained.
        dtype: `None` (the global dtype policy) or a dtype policy (e.g.
            `"mixed_bfloat16"`, or a `DTypePolicyMap`) for every layer.

    The model's `get_config` is its parts' fields as built (flat, under
    their argument names), so a `.keras` file reloads by building the model
    again and a configuration can be read and edited as data. A model
    changed in place after it was built (quantized, frozen layers, or
    grafted onto layers before `input_tensor`) saves its graph instead and
    reloads as a plain functional model.

    Returns:
        A `keras.Model`: logits or probabilities `(batch, classes)`; with
        `include_top=False`, features `(batch, hidden_dim)` (or
        `representation_size`), or tokens `(batch, num_tokens, hidden_dim)`
        with `pooling=None`.

    Example:

    >>> from keras_vit.models.parts import Encoder, Head, ImageInput, Patches
    >>> model = VisionTransformer(
    ...     Encoder(hidden_dim=32, num_layers=2, num_heads=2, mlp_dim=64),
    ...     image=ImageInput(input_shape=(28, 28, 1)),
    ...     patches=Patches(patch_size=4),
    ...     head=Head(classes=10),
    ... )
    >>> model.output_shape
    (None, 10)
    """

    def __init__(
        self,
        encoder=None,
        *,
        image=None,
        patches=None,
        tokens=None,
        positions=None,
        head=None,
        qat=None,
        input_tensor=None,
        name="vision_transformer",
        trainable=True,
        dtype=None,
    ):
        # Everything is checked before any weight is created.
        image = (image or ImageInput()).with_input(input_tensor)
        patches, tokens = patches or Patches(), tokens or TokenLayout()
        positions = (positions or Positions()).for_input(image)
        encoder, head = encoder or Encoder(), head or Head()
        parts = {
            "image": image,
            "patches": patches,
            "tokens": tokens,
            "positions": positions,
            "encoder": encoder,
            "head": head,
        }
        _check_together(parts, qat)
        policy = None if dtype is None else keras.dtype_policies.get(dtype)
        remat_scope = _compat.remat_scope()

        # The layers.
        if input_tensor is None:
            images = inputs = keras.Input(shape=image.input_shape, name="images")
        else:
            images, inputs = input_tensor, keras.utils.get_source_inputs(input_tensor)
        stem = patches.stem(policy)
        grid_size = patches.grid_size(positions.table_size(image), stem)
        x = image.preprocess(images, policy)
        x, grid = patches.embed(
            x,
            stem,
            encoder.hidden_dim,
            keep_grid=image.dynamic or positions.rotary,
            round_outputs=not tokens.class_token,
            qat=qat,
            dtype=policy,
        )
        x = tokens.prepend(x, qat, policy, registers=positions.rotary)
        if not positions.rotary:
            x = positions.add(x, grid_size, tokens.num_embedded, grid, policy)
            x = tokens.insert_registers(x, policy)
            x = model_parts.quantization_point(x, qat, "position_embedding", "steps")
        rotation = positions.rotation(grid, encoder, tokens.num_prefix, policy)
        x = encoder.encode(
            x,
            tokens.num_prefix,
            qat=qat,
            remat_scope=remat_scope,
            dtype=policy,
            rotation=rotation,
        )
        outputs = head.apply(x, encoder, tokens, qat=qat, dtype=policy)

        # The functional model.
        super().__init__(inputs, outputs, name=name)
        if policy is not None:
            self.dtype_policy = policy
            _compat.hold_own_policies(self)
        if remat_scope is not None and remat_scope.mode != "activations":
            # The blocks took the scope over (see `parts.Encoder.encode`).
            _compat.without_keras_remat([self, *self.operations, *_compat.all_layers(self)])
        self.trainable = trainable
        self._sizes_checked = frozenset()  # input sizes that `_check_image_size` passed

        # The configuration: the parts as built (a checkpoint's values in
        # place of the defaults, with `weights=`), so a file rebuilds this function.
        self._parts = types.MappingProxyType(parts)
        self._qat = qat
        self._grafted = input_tensor is not None and not (
            len(inputs) == 1 and inputs[0] is input_tensor
        )

    @classmethod
    def from_arguments(
        cls,
        *,
        qat=None,
        input_tensor=None,
        name="vision_transformer",
        trainable=True,
        dtype=None,
        **arguments,
    ):
        """A model from flat arguments: its parts' fields under their names (`parts.ARGUMENTS`).

        What `get_config` writes, and what the builders (`keras_vit.ViT`,
        `ViTB16`, ...) take; a name that is no part's field is a `TypeError`.

        Example:

        >>> model = VisionTransformer.from_arguments(
        ...     patch_size=4, hidden_dim=32, num_layers=2, num_heads=2,
        ...     mlp_dim=64, input_shape=(28, 28, 1), classes=10,
        ... )
        >>> model.output_shape
        (None, 10)
        """
        return cls(
            **model_parts.parts_from_arguments(arguments),
            qat=qat,
            input_tensor=input_tensor,
            name=name,
            trainable=trainable,
            dtype=dtype,
        )

    @property
    def parts(self):
        """`{name: part}`: the parts the model was assembled from (read-only)."""
        return self._parts

    @property
    def qat(self):
        """The LiteRT quantization the model simulates (`"int8"`, `"int8_full"`), or `None`."""
        return self._qat

    def fit(self, x=None, *args, **kwargs):
        self._check_image_size(x)
        return super().fit(x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        self._check_image_size(x)
        return super().evaluate(x, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        self._check_image_size(x)
        return super().predict(x, *args, **kwargs)

    def _check_image_size(self, x):
        """Images of a size the model cannot take fail here, before Keras' loop starts.

        A model of any size learns the size of its images only when they
        arrive, and inside Keras' loops an error is worse than our
        `ValueError`: JAX's take the weights out of the model while they
        run (an error there leaves it without them: every later call
        fails), TensorFlow's graphs raise it as an assertion op's failure.
        Checked symbolically, once per size.
        """
        if None not in self.input_shape[1:] or self._parts["patches"].pad_to_patches:
            return
        shape = _batch_shape(x)
        if shape is None or len(shape) != len(self.input_shape) or None in shape[1:]:
            return
        if shape[1:] not in self._sizes_checked:
            self.compute_output_spec(keras.KerasTensor((None, *shape[1:])))
            self._sizes_checked = self._sizes_checked | {shape[1:]}

    def quantize(self, mode=None, *args, **kwargs):
        if self._qat is not None:
            # (Keras quantizes leaf layers only: it would skip every layer
            # that holds quantizers and return the model as it was.)
            raise ValueError(
                f"Model {self.name!r} simulates LiteRT's {self._qat!r} quantization (qat): export "
                f"it with keras_vit.export.tflite(model, path, quantization={self._qat!r}), or "
                f"quantize the float model it was copied from. Received: mode={mode!r}"
            )
        with warnings.catch_warnings():
            # Keras says so of every layer without weights to quantize (its own
            # Rescaling and Dropout too): nothing of the model is left unquantized.
            warnings.filterwarnings("ignore", message="Layer .* does not have a `quantize` method")
            return super().quantize(mode, *args, **kwargs)

    def enable_lora(self, rank, target=lora.DEFAULT_TARGETS, alpha=None):
        """LoRA adapters on every block's `target` projections (see `models.lora.enable_lora`)."""
        return lora.enable_lora(self, rank, target=target, alpha=alpha)

    def save_lora_weights(self, path):
        """Writes the adapters and the head to a `.lora.h5` file (`models.lora`)."""
        lora.save_lora_weights(self, path)

    def load_lora_weights(self, path):
        """Reads a `save_lora_weights` file into this model's LoRA (`models.lora`)."""
        lora.load_lora_weights(self, path)

    def save_to_preset(self, preset_dir):
        """Writes the encoder as a keras-hub backbone preset (`models.keras_hub_preset`)."""
        from keras_vit.models.keras_hub_preset import save_to_preset

        return save_to_preset(self, preset_dir)

    def get_compile_config(self):
        # A LoRA model saves as its merged model (`_changed_in_place`): its
        # optimizer's state is the adapters', which the file does not hold,
        # and would not load into the model the file builds (Keras would warn
        # of a variable count mismatch). The file's model comes uncompiled, as
        # `merge_lora` returns it.
        if lora.lora_settings(self) is not None:
            return None
        return super().get_compile_config()

    def get_config(self):
        if self._grafted or _changed_in_place(self):
            # Its graph is no longer what the parts build (layers before
            # the input, quantized or frozen layers): the graph's own config.
            return keras.Model(self.inputs, self.outputs, name=self.name).get_config()
        arguments = model_parts.arguments_of(self._parts)
        if callable(arguments["classifier_activation"]):
            arguments["classifier_activation"] = keras.activations.serialize(
                arguments["classifier_activation"]
            )
        return {
            **arguments,
            "qat": self._qat,
            "name": self.name,
            "trainable": self.trainable,
            "dtype": _dtype_policy_config(self),
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        if "layers" in config:  # a graph's config (see `get_config`)
            return keras.Model.from_config(config, custom_objects=custom_objects)
        # Files of versions without `data_format` were channels-last.
        return cls.from_arguments(**{"data_format": "channels_last", **config})


def _check_together(parts, qat):
    """The rules between parts (each part checked its own fields when it was made)."""
    image, encoder, head = parts["image"], parts["encoder"], parts["head"]
    head.check_tokens(parts["tokens"])
    if encoder.patch_dropout_rate and parts["positions"].rotary:
        raise ValueError(
            "patch_dropout_rate drops patch tokens, whose rotations "
            f"position_embedding={parts['positions'].kind!r} computes for the whole grid. "
            f"Received: patch_dropout_rate={encoder.patch_dropout_rate!r}"
        )
    if encoder.patch_dropout_rate and image.dynamic:
        raise ValueError(
            "patch_dropout_rate needs a fixed input size; a model of run-time "
            f"resolution was asked for. Received: patch_dropout_rate="
            f"{encoder.patch_dropout_rate!r}, input_shape={image.image_size!r}"
        )
    vit_layers.fake_quantization.check_qat(qat)
    if qat is not None:
        arguments = model_parts.arguments_of(parts)
        unsupported = layouts.qat_unsupported(arguments, folded=True)
        if unsupported:
            raise ValueError(
                f"qat={qat!r} simulates the plain ViT layout; "
                f"{layouts.described(unsupported)} has layers it does not simulate."
            )


def _batch_shape(x):
    """The static shape of a batch of images (an array, a tensor, a tf.data element), or None."""
    spec = getattr(x, "element_spec", None)  # a tf.data.Dataset
    if spec is not None:
        spec = spec[0] if isinstance(spec, (tuple, list)) else spec
        shape = getattr(spec, "shape", None)
        return None if shape is None or shape.rank is None else tuple(shape.as_list())
    shape = getattr(x, "shape", None)
    return None if shape is None else tuple(None if s is None else int(s) for s in shape)


def _own_policy(layer):
    """The dtype policy `layer` computes with (its entry, where it holds a `DTypePolicyMap`)."""
    policy = layer.dtype_policy
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap) and layer.path:
        return policy[layer.path]
    return policy


def _dtype_policy_config(model):
    """The model's dtype policy, as `dtype=` rebuilds it: a quantized model's is a map.

    The map (keras-hub's way) names each quantized layer's policy by its
    path (`encoderblock_0/attention/qkv`: `int8_from_float32`), so that the
    rebuilt layers create their quantized variables, whether the model was
    quantized after it was built or built from such a map.
    """
    policy = model.dtype_policy
    quantized = {
        layer.path: _own_policy(layer)
        for layer in _compat.all_layers(model)
        if layer.quantization_mode is not None
    }
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
        # A copy: the model's own map is what its layers compute with.
        default, entries = policy.default_policy, {path: policy[path] for path in policy}
    elif quantized:
        default, entries = policy, {}
    else:
        return policy.name
    entries.update({path: p for path, p in quantized.items() if path not in entries})
    return keras.dtype_policies.serialize(keras.dtype_policies.DTypePolicyMap(default, entries))


def _changed_in_place(model):
    """Whether a model's layers were frozen after it was built.

    Not by LoRA: a LoRA model's file holds the merged kernels, the model
    its arguments build.
    """
    if lora.lora_settings(model) is not None:
        return False
    return model.trainable and any(not layer.trainable for layer in model.layers)


def default_arguments():
    """`{argument: default}` of every flat argument `VisionTransformer.from_arguments` takes."""
    own = {
        name: parameter.default
        for name, parameter in inspect.signature(
            VisionTransformer.from_arguments
        ).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }
    return {**model_parts.default_arguments(), **own}
