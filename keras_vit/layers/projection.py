"""A Keras `EinsumDense` whose float call is one 2-D matmul: attention's projections."""

import math
import re

import keras
from keras import ops

from keras_vit import _compat
from keras_vit.layers import fake_quantization

# `a<contracted>,<contracted><kept>-><a><kept>`: every non-batch axis of the
# inputs is contracted, and the outputs keep the kernel's other axes.
_FLAT_EQUATION = re.compile(r"a([b-z]+),\1([b-z]+)->a\2")


@keras.saving.register_keras_serializable(package="keras_vit")
class Projection(_compat.EinsumDenseWithOwnLoRA):
    """`keras.layers.EinsumDense` that contracts all of its inputs' axes in one matmul.

    Attention keeps its kernels in head-major layouts, `(D, 3, heads,
    head_dim)` for the fused query-key-value projection and `(heads,
    head_dim, D)` for the output projection, so that they shard by heads.
    As an `EinsumDense` they are what Keras' `quantize` (int8, int4,
    float8, GPTQ), `enable_lora` and `DTypePolicyMap` know. Unquantized, the
    call flattens the inputs and the kernel to 2-D matrices: TensorFlow then
    runs one oneDNN inner product with the bias fused in, as for a `Dense`,
    and a LiteRT file gets one `FULLY_CONNECTED` (an einsum with a 4-D
    kernel stays a matmul, a reshape and a separate add). Quantized, Keras'
    own `EinsumDense` calls run, with the slot adapters' term added (QLoRA).

    Args:
        equation: `"a<in>,<in><out>->a<out>"`: every non-batch input axis
            contracted (`"ab,bcde->acde"`, `"abc,bcd->ad"`).
        output_shape: the shape of the kept axes (`(3, heads, head_dim)`).
        bias_axes: `None`, or all of the kept axes (`"cde"`).
        qat: `None`, or the LiteRT mode that training simulates (`"int8"`,
            `"int8_full"`; see `layers.fake_quantization`): the kernel
            rounded per output channel, the outputs (and in `"int8"` the
            inputs) per tensor.
        round_inputs: bool, whether `"int8"` rounds the inputs (`False`
            where the layer before rounds its outputs already).
        symmetric_outputs: bool, whether the outputs' int8 range keeps zero
            point 0 (`True` where they are the right operand of LiteRT's
            int8 batch matmul: attention's keys and values).
        slotted: bool, whether the kernel's axis 1 stacks projections
            (`(D, 3, heads, head_dim)`: query, key and value), each of
            which `enable_lora(..., slots=)` adapts on its own (`True`); or
            the kernel is one projection of all its outputs (`(D, heads,
            head_dim)`: a MAP head's query), slot 0 (`False`).
        **kwargs: the other arguments of `keras.layers.EinsumDense`.

    Example:

    >>> layer = Projection("ab,bcd->acd", output_shape=(2, 4), bias_axes="cd")
    >>> tuple(layer(keras.ops.ones((3, 8))).shape)
    (3, 2, 4)
    """

    def __init__(
        self,
        equation,
        output_shape,
        bias_axes=None,
        qat=None,
        round_inputs=True,
        symmetric_outputs=False,
        slotted=True,
        **kwargs,
    ):
        match = _FLAT_EQUATION.fullmatch(equation)
        if match is None or bias_axes not in (None, match.group(2)):
            raise ValueError(
                "`equation` must contract every non-batch input axis, as "
                "'a<in>,<in><out>->a<out>', with `bias_axes` None or <out>. "
                f"Received: equation={equation!r}, bias_axes={bias_axes!r}"
            )
        super().__init__(equation, output_shape, bias_axes=bias_axes, **kwargs)
        self.qat = fake_quantization.check_qat(qat)
        self.round_inputs = round_inputs
        self.symmetric_outputs = bool(symmetric_outputs)
        self.slotted = bool(slotted)

    def build(self, input_shape):
        super().build(input_shape)
        points = {"outputs": "dense_outputs"}
        if self.round_inputs:
            points["inputs"] = "dense_inputs"
        self.quantizers = fake_quantization.quantizers(
            self.qat, points, symmetric=("outputs",) if self.symmetric_outputs else ()
        )
        if self.qat is not None:
            self.output_scale = fake_quantization.add_output_scale(self)

    def call(self, inputs, training=None):
        width = math.prod(inputs.shape[1:])
        inputs = ops.reshape(inputs, (-1, width))
        if self.quantizers:
            inputs = fake_quantization.at_point(self.quantizers, "inputs", inputs, training)
        bias = None if self.bias is None else ops.reshape(self.bias, (-1,))
        if self.lora_slots is None or self.qat is not None:
            # (Simulating LiteRT, the adapters are merged into the kernel
            # that is rounded, as the exported file holds them.)
            kernel = ops.reshape(self.kernel, (width, -1))
            if self.qat is not None:
                kernel, bias = fake_quantization.scaled(self, kernel, bias)
            outputs = ops.matmul(inputs, kernel)
        else:
            # The frozen kernel and the adapters apart: a step then needs no
            # gradient of the whole kernel, only of the thin factors.
            frozen = ops.cast(_compat.stored_kernel(self), self.compute_dtype)
            outputs = ops.matmul(inputs, ops.reshape(frozen, (width, -1)))
            outputs = outputs + self._lora_outputs(inputs)
        if bias is not None:
            outputs = outputs + bias
        outputs = fake_quantization.at_point(self.quantizers, "outputs", outputs, training)
        return ops.reshape(outputs, (-1, *self.partial_output_shape))

    # LoRA on chosen slots of the kernel's axis 1 (`enable_lora(..., slots=)`).
    lora_slots = None

    @property
    def kernel(self):
        if self.lora_slots is None:
            return super().kernel
        # (Quantized: the int8 kernel as floats, the update added.)
        base = self.dequantized_kernel() if self.quantization_mode else _compat.stored_kernel(self)
        return ops.cast(ops.add(base, self.own_lora_update()), self.compute_dtype)

    @property
    def own_lora(self):
        return self.lora_slots is not None

    def _slot_layout(self):
        """`(inputs, slots, outputs of a slot)`: the kernel as its LoRA slots see it."""
        shape = tuple(_compat.stored_kernel(self).shape)
        if self.slotted:
            return shape[0], shape[1], math.prod(shape[2:])
        return shape[0], 1, math.prod(shape[1:])

    def own_lora_update(self):
        """The slots' update of the kernel: `(alpha / rank) * A @ B` in each, zeros elsewhere.

        A is `(D, rank)` and B `(rank, heads * head_dim)`, one pair per slot.
        """
        updates = (self.lora_alpha / self.lora_rank) * ops.matmul(
            self.lora_kernel_a, self.lora_kernel_b
        )
        zeros = ops.zeros(updates.shape[1:], dtype=updates.dtype)
        columns = [
            updates[self.lora_slots.index(slot)] if slot in self.lora_slots else zeros
            for slot in range(self._slot_layout()[1])
        ]
        shape = tuple(_compat.stored_kernel(self).shape)
        return ops.reshape(ops.stack(columns, axis=1), shape)

    def own_lora_outputs(self, inputs, outputs_shape):
        """The slot adapters' term of a quantized call's outputs (Keras' QLoRA, per slot)."""
        flat = ops.reshape(inputs, (-1, math.prod(inputs.shape[1:])))
        return ops.reshape(self._lora_outputs(ops.cast(flat, self.compute_dtype)), outputs_shape)

    def _lora_outputs(self, inputs):
        """`inputs @ update` of the slot adapters, `(alpha / rank) * (inputs @ A) @ B` per slot."""
        scale = self.lora_alpha / self.lora_rank
        adapted = {}
        for index, slot in enumerate(self.lora_slots):
            a = ops.cast(self.lora_kernel_a[index], self.compute_dtype)
            b = ops.cast(self.lora_kernel_b[index], self.compute_dtype)
            adapted[slot] = ops.matmul(ops.matmul(inputs, a), b) * scale
        zeros = ops.zeros_like(adapted[self.lora_slots[0]])
        columns = [adapted.get(slot, zeros) for slot in range(self._slot_layout()[1])]
        return ops.concatenate(columns, axis=-1)

    def enable_lora(
        self, rank, lora_alpha=None, a_initializer="he_uniform", b_initializer="zeros", slots=None
    ):
        """Keras' LoRA on the whole kernel; with `slots`, LoRA on those slots of axis 1 only.

        For the fused q/k/v kernel `(D, 3, heads, head_dim)`, `slots=(0, 2)`
        adapts the query and the value, each with its own `(D, rank)` and
        `(rank, heads * head_dim)` factors: LoRA as on separate query and
        value projections. (Keras' own LoRA of this kernel would factor
        each slot and head apart.) An unslotted kernel (`slotted=False`,
        `(D, heads, head_dim)`) is one slot, 0: `(D, rank)` and `(rank,
        heads * head_dim)` factors, where Keras' would give each head its
        own. The kernel is frozen; the merged kernel
        is what `kernel` returns and what a saved file holds. On a layer
        quantized by Keras (`"int8"`), the adapters train beside the int8
        kernel and a saved file holds their merge requantized: Keras' QLoRA.
        """
        if slots is None:
            return super().enable_lora(rank, lora_alpha, a_initializer, b_initializer)
        shape = tuple(_compat.stored_kernel(self).shape)
        slots = tuple(slots)
        inputs, count, outputs = self._slot_layout()
        if (self.slotted and len(shape) < 3) or not slots or not set(slots) <= set(range(count)):
            raise ValueError(
                f"`slots` must name slots of axis 1 of the kernel {shape}. "
                f"Received: slots={slots!r}"
            )
        if self.lora_enabled or self.quantization_mode not in (None, "int8"):
            raise ValueError(
                f"LoRA needs a float or int8 layer without LoRA; {self.name!r} has "
                f"{'LoRA' if self.lora_enabled else self.quantization_mode!r} already."
            )
        with _compat.state_unlocked(self):
            self.lora_kernel_a = self.add_weight(
                name="lora_kernel_a",
                shape=(len(slots), inputs, rank),
                initializer=keras.initializers.get(a_initializer),
                dtype="float32",
            )
            self.lora_kernel_b = self.add_weight(
                name="lora_kernel_b",
                shape=(len(slots), rank, outputs),
                initializer=keras.initializers.get(b_initializer),
                dtype="float32",
            )
        _compat.stored_kernel(self).trainable = False
        self.lora_enabled = True
        self.lora_rank = rank
        self.lora_alpha = lora_alpha if lora_alpha is not None else rank
        self.lora_slots = slots

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras' EinsumDense refuses to quantize subclasses, whose `call` it
        # cannot vouch for; quantized, this one runs EinsumDense's own calls.
        fake_quantization.refuse_keras_quantize(self)
        if self.lora_slots is not None:
            raise ValueError(
                f"Layer {self.name!r} has LoRA on slots {self.lora_slots} of its kernel, which "
                "Keras' quantized calls do not compute: quantize the merged model "
                "(`keras_vit.models.merge_lora`)."
            )
        super().quantize(mode, type_check=False, config=config)

    @property
    def variable_serialization_spec(self):
        return fake_quantization.serialization_spec(self, super().variable_serialization_spec)

    def get_config(self):
        return {
            **super().get_config(),
            "qat": self.qat,
            "round_inputs": self.round_inputs,
            "symmetric_outputs": self.symmetric_outputs,
            "slotted": self.slotted,
        }

    def assign_loaded(self, kernel, bias=None):
        """Sets the variables from a file that held them in the parent layer's own.

        The parent's (`MultiHeadSelfAttention`'s) variables load before its
        sublayers', so the file's empty entry for this layer that follows
        is then skipped.
        """
        _compat.stored_kernel(self).assign(kernel)
        if bias is not None:
            self.bias.assign(bias)
        self._assigned_by_parent = True

    def load_own_variables(self, store):
        if self._assigned_by_parent and not len(store.keys()):
            self._assigned_by_parent = False
            return
        super().load_own_variables(store)

    _assigned_by_parent = False
