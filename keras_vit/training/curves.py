"""A run's learning curves: `history.csv` drawn as loss and accuracy per epoch."""


def plot_history(csv_path, png_path):
    """Plots loss and accuracy per epoch from a `history.csv`."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None
    from matplotlib.ticker import MaxNLocator

    epochs = [int(r["epoch"]) for r in rows]  # counted from 1, as the run printed them
    figure, axes = plt.subplots(1, 2, figsize=(9, 3.5))

    def number(text):
        try:
            return float(text)
        except (TypeError, ValueError):  # "NA": not evaluated that epoch
            return None

    for axis, metric in zip(axes, ("loss", "accuracy")):
        if metric not in rows[0]:  # e.g. pixel regression: a loss only
            axis.set_visible(False)
            continue
        for prefix, label in (("", "train"), ("val_", "test")):
            points = [(e, number(r.get(prefix + metric))) for e, r in zip(epochs, rows)]
            points = [(e, v) for e, v in points if v is not None]
            if points:
                axis.plot(*zip(*points), "o-", label=label)
        axis.set_xlabel("epoch")
        if max(epochs) - min(epochs) < 20:
            axis.set_xticks(range(min(epochs), max(epochs) + 1))
        else:
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_xlim(min(epochs) - 0.5, max(epochs) + 0.5)
        axis.set_title(metric)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(png_path, dpi=100)
    plt.close(figure)
    return png_path
