"""Checkpoints on the Hugging Face Hub, named as timm names them: `"hf-hub:org/name"`.

The files go through `huggingface_hub` and its own cache
(`~/.cache/huggingface/hub`, or `HF_HOME` / `HF_HUB_CACHE`): downloaded once
when online, read from the cache when offline (or with `HF_HUB_OFFLINE=1`),
shared with every other library that reads the Hub.
"""

import os

PREFIX = "hf-hub:"
# The weights, in the order they are looked for; the configs are read beside them.
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
CONFIG_FILES = ("config.json", "preprocessor_config.json")


def is_hub_id(weights):
    return isinstance(weights, str) and weights.startswith(PREFIX)


def checkpoint_file(weights):
    """The local checkpoint file of `"hf-hub:org/name[@revision]"`; other `weights` as given.

    Its `config.json` and `preprocessor_config.json` come with it (into the
    same snapshot folder), so the file reads as any Hugging Face checkpoint.

    Raises:
        ImportError: without `huggingface_hub` (the `hub` extra).
        RuntimeError: when neither the Hub nor the cache has the files.

    Example:

    ```python
    keras_vit.ViTB16(weights="hf-hub:google/vit-base-patch16-224")
    ```
    """
    if not is_hub_id(weights):
        return weights
    repo_id, _, revision = weights[len(PREFIX) :].partition("@")
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(
            f"A Hub checkpoint is named 'hf-hub:<organisation>/<name>[@<revision>]'. "
            f"Received: weights={weights!r}"
        )
    try:
        import huggingface_hub
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
    except ImportError:
        raise ImportError(
            f"weights={weights!r} needs huggingface_hub: pip install 'keras-vit[hub]'"
        ) from None

    def download(name):
        return huggingface_hub.hf_hub_download(repo_id, name, revision=revision or None)

    def failed(name, error):
        cache = os.environ.get("HF_HUB_CACHE") or "~/.cache/huggingface/hub"
        return RuntimeError(
            f"Could not get {name} of {repo_id!r} from the Hugging Face Hub or its cache "
            f"{cache} ({type(error).__name__}: {error}). Online, it downloads once; "
            f"offline, download it on a machine with internet access (`hf download "
            f"{repo_id}`) and copy the cache, or pass the file's path."
        )

    path = error = None
    for name in WEIGHT_FILES:
        try:
            path = download(name)
            break
        except EntryNotFoundError as missing:  # not in the repository, or not cached offline
            error = missing
        except Exception as refused:  # no such repository, a gated one, ...
            raise failed(" or ".join(WEIGHT_FILES), refused) from refused
    if path is None:
        raise failed(" or ".join(WEIGHT_FILES), error) from error
    for name in CONFIG_FILES:
        try:
            download(name)
        except LocalEntryNotFoundError as offline:
            # Offline: fine if the Hub said it has none (the cache's `.no_exist`
            # marker); unknown, the model's function would be a guess.
            cached = huggingface_hub.try_to_load_from_cache(
                repo_id, name, revision=revision or None
            )
            if cached is None or isinstance(cached, str):  # (a str: cached, yet not found)
                raise failed(name, offline) from offline
        except EntryNotFoundError:  # the repository has none: its format's conventions apply
            pass
    return path
