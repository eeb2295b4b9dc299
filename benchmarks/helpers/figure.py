"""The small picture a benchmark draws of its run: seconds per contender, one panel per measure
(training blocked, until durable, load), fastckpt's bars in one colour, the physical bounds of the
same run hatched, every peer in grey, each bar labelled with its seconds. helpers/results.keep
commits it as benchmarks/figures/NAME.png and the RESULTS.md section shows it."""
from __future__ import annotations

Bar = tuple[str, float]  # (label, seconds); a label with "bound" is a bound, one with "fastckpt" ours


def panels(path: str, title: str, measures: list[tuple[str, list[Bar]]]) -> None:
    """measures: [(panel title, bars)], each panel's bars drawn top to bottom in the given order
    (bars with no value left out)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    measures = [(name, [(label, s) for label, s in bars if s is not None and s == s]) for name, bars in measures]
    measures = [(name, bars) for name, bars in measures if bars]
    rows = max(len(bars) for _, bars in measures)
    fig, axes = plt.subplots(1, len(measures), figsize=(4.2 * len(measures), 0.42 * rows + 1.3), squeeze=False)
    for ax, (name, bars) in zip(axes[0], measures):
        labels = [label for label, _ in bars][::-1]
        values = [s for _, s in bars][::-1]
        colours = ["#1f77b4" if "fastckpt" in label else "white" if "bound" in label else "#9a9a9a"
                   for label in labels]
        drawn = ax.barh(range(len(bars)), values, color=colours, edgecolor="#333333", linewidth=0.6)
        for bar, label in zip(drawn, labels):
            if "bound" in label:
                bar.set_hatch("///")
        top = max(values)
        for i, s in enumerate(values):
            ax.text(s + top * 0.02, i, f"{s:.3f} s", va="center", fontsize=7)
        ax.set_yticks(range(len(bars)))
        ax.set_yticklabels(labels, fontsize=7)
        ax.set_xlim(0, top * 1.3)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("seconds (median; shorter is better)", fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
