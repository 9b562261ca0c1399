"""Registered pretrained checkpoints: names -> public files and their configs.

`weights="imagenet21k"` on `keras_vit.ViTB16()` looks up `("B/16",
"imagenet21k")` here, downloads the file through `keras.utils.get_file`
(cached in `~/.keras/keras_vit/`, checked against its SHA-256 when one is
recorded) and builds the model the checkpoint expects: its resolution,
class count, `pre_logits` layer and pixel normalisation. `"imagenet"` is
each variant's ImageNet-1k classifier (`IMAGENET_CHECKPOINTS`).
"""

import dataclasses
import hashlib
import os

from keras_vit import _options

GOOGLE = "https://storage.googleapis.com/vit_models"
CACHE_SUBDIR = "keras_vit"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A published checkpoint and the model configuration it was trained in.

    Attributes:
        variant: `"B/16"` etc. (see `keras_vit.models.decode_variant`).
        url: where the file is published.
        sha256: hex digest of the file, or `None` where none is recorded
            (the file is then used unchecked).
        image_size: the resolution it was trained (or fine-tuned) at.
        classes: the class count of its head (21843 for ImageNet-21k).
        representation_size: width of its `pre_logits` layer, or `None`.
        normalization: the pixel normalisation it was trained with
            (`"inception"`: `[-1, 1]`; `"imagenet"`: ImageNet mean/std).
        label_set: the names of its head's classes (see
            `keras_vit.labels.LABEL_SETS`), or `None`.
    """

    variant: str
    url: str
    sha256: str = None
    image_size: int = 224
    classes: int = 1000
    representation_size: int = None
    normalization: str = "inception"
    label_set: str = "imagenet-1k"

    @property
    def file_name(self):
        return self.url.rsplit("/", 1)[-1].replace("%2B", "+")


CHECKPOINTS = {}

# `weights="imagenet"`, keras.applications' name for a builder's ImageNet-1k
# classifier, is the variant's best ImageNet-1k fine-tune at the builders'
# default 224 px (AugReg's: ImageNet-21k pre-training, the run the AugReg
# paper recommends); L/32 was only published fine-tuned at 384 px.
IMAGENET = "imagenet"
IMAGENET_CHECKPOINTS = {
    "Ti/16": "augreg-imagenet21k+imagenet2012",
    "S/16": "augreg-imagenet21k+imagenet2012",
    "S/32": "augreg-imagenet21k+imagenet2012",
    "B/8": "augreg-imagenet21k+imagenet2012",
    "B/16": "augreg-imagenet21k+imagenet2012",
    "B/32": "augreg-imagenet21k+imagenet2012",
    "L/16": "augreg-imagenet21k+imagenet2012",
    "L/32": "imagenet21k+imagenet2012",
}


def register(name, checkpoint):
    """Registers `checkpoint` as `weights=name` for its variant.

    Example:

    >>> register("my-run", Checkpoint("Ti/16", "file:///data/ti16.npz"))
    >>> lookup("Ti/16", "my-run").file_name
    'ti16.npz'
    >>> del CHECKPOINTS[("Ti/16", "my-run")]
    """
    if not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"`checkpoint` must be a Checkpoint. Received: {checkpoint!r}")
    CHECKPOINTS[(checkpoint.variant, name)] = checkpoint


def names(variant=None):
    """The registered names, for `variant` or all."""
    return sorted({n for v, n in CHECKPOINTS if variant in (None, v)})


def lookup(variant, name):
    """The `Checkpoint` registered as `name` for `variant`, or a clear error."""
    if (variant, name) not in CHECKPOINTS:
        available = names(variant)
        raise ValueError(
            f"No checkpoint named {name!r} is registered for ViT-{variant}; "
            f"registered: {available or 'none'}. Pass the path of a local "
            "checkpoint instead."
        )
    return CHECKPOINTS[(variant, name)]


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(checkpoint):
    """The local path of `checkpoint`, downloaded once into the Keras cache.

    The file is checked against the entry's SHA-256. An entry without one
    (the Google files, whose hashes could not be taken on the offline
    machine this package was built on) is pinned on first use: the hash of
    the first download is written beside it (`FILE.sha256`) and every
    later use is checked against it, so a corrupted or replaced cache file
    is downloaded again, and a changed upstream file is refused.

    Raises:
        RuntimeError: offline (or any failed download or hash mismatch),
            saying what to download and where to put it.
    """
    import keras

    keras_home = os.path.expanduser(os.environ.get("KERAS_HOME", "~/.keras"))
    cache_dir = os.path.join(keras_home, CACHE_SUBDIR)
    try:
        os.makedirs(cache_dir, exist_ok=True)  # get_file uses /tmp when absent
    except OSError:
        pass
    pin_path = os.path.join(cache_dir, checkpoint.file_name + ".sha256")
    expected = checkpoint.sha256
    if expected is None and os.path.isfile(pin_path):
        with open(pin_path) as f:
            expected = f.read().strip()
    try:
        path = keras.utils.get_file(
            checkpoint.file_name,
            origin=checkpoint.url,
            file_hash=expected,
            hash_algorithm="sha256",
            cache_dir=keras_home,
            cache_subdir=CACHE_SUBDIR,
        )
    except Exception as error:
        raise RuntimeError(
            f"Could not download the ViT-{checkpoint.variant} checkpoint "
            f"{checkpoint.url} ({type(error).__name__}: {error}). Download it "
            f"on a machine with internet access and put it at "
            f"{os.path.join(cache_dir, checkpoint.file_name)}, or pass its "
            f"local path as {_options.name('weights')}."
        ) from error
    if expected is None:
        temporary = pin_path + ".tmp"
        with open(temporary, "w") as f:
            f.write(_sha256(path) + "\n")
        os.replace(temporary, pin_path)
    return path


def _register_published():
    # The paper's checkpoints (google-research/vision_transformer): the
    # ImageNet-21k ones keep the pre-training `pre_logits` layer.
    widths = {"Ti": 192, "S": 384, "B": 768, "L": 1024, "H": 1280}
    for variant in ("B/16", "B/32", "L/16", "L/32", "H/14"):
        file = f"ViT-{variant.replace('/', '_')}.npz"
        register(
            "imagenet21k",
            Checkpoint(
                variant,
                f"{GOOGLE}/imagenet21k/{file}",
                classes=21843,
                representation_size=widths[variant.split("/")[0]],
                label_set="imagenet-21k",
            ),
        )
        if variant != "H/14":
            register(
                "imagenet21k+imagenet2012",
                Checkpoint(
                    variant,
                    f"{GOOGLE}/imagenet21k%2Bimagenet2012/{file}",
                    image_size=384,
                ),
            )
    for variant in ("B/16", "L/16"):
        file = f"ViT-{variant.replace('/', '_')}-224.npz"
        register(
            "imagenet21k+imagenet2012@224",
            Checkpoint(
                variant,
                f"{GOOGLE}/imagenet21k%2Bimagenet2012/{file}",
            ),
        )
    # AugReg ("How to train your ViT?", Steiner et al. 2021): the runs the
    # paper recommends per variant, pre-trained on ImageNet-21k and
    # fine-tuned on ImageNet-1k at 224 and 384.
    augreg = {
        "Ti/16": ("none", "0.03", "0.0", "0.03"),
        "S/16": ("light1", "0.03", "0.0", "0.03"),
        "S/32": ("light1", "0.03", "0.0", "0.03"),
        "B/8": ("medium1", "0.1", "0.0", "0.01"),
        "B/16": ("medium1", "0.1", "0.0", "0.01"),
        "B/32": ("medium1", "0.03", "0.0", "0.03"),
        "L/16": ("medium1", "0.1", "0.1", "0.01"),
    }
    for variant, (aug, wd, drop, ft_lr) in augreg.items():
        stem = (
            f"{GOOGLE}/augreg/{variant.replace('/', '_')}-i21k-300ep-lr_0.001-"
            f"aug_{aug}-wd_{wd}-do_{drop}-sd_{drop}"
        )
        register(
            "augreg-imagenet21k",
            Checkpoint(variant, stem + ".npz", classes=21843, label_set="imagenet-21k"),
        )
        for size in (224, 384):
            run = stem
            if (variant, size) == ("B/32", 384):  # the recommended 384 run differs
                run = stem.replace("aug_medium1-wd_0.03", "aug_light1-wd_0.1")
            suffix = "" if size == 224 else f"@{size}"
            register(
                f"augreg-imagenet21k+imagenet2012{suffix}",
                Checkpoint(
                    variant,
                    f"{run}--imagenet2012-steps_20k-lr_{ft_lr}-res_{size}.npz",
                    image_size=size,
                ),
            )
    for variant, name in IMAGENET_CHECKPOINTS.items():
        register(IMAGENET, lookup(variant, name))


_register_published()
