"""The sweep's outputs: a markdown table and a PNG plot of speedup and throughput against concurrency."""

from pathlib import Path

from .summary import Level


def table(levels: list[Level]) -> str:
    head = ("| concurrency | on tok/s | off tok/s | speedup | on p50 / p95 latency s | off p50 / p95 latency s "
            "| on p50 TTFT s | off p50 TTFT s | tokens/step (on) | failures on / off | identical |")
    rows = [head, "|" + "---|" * 11]
    for lv in levels:
        on, off = lv.on, lv.off
        rows.append(
            f"| {lv.concurrency} | {on.tok_s:.1f} | {off.tok_s:.1f} | **{lv.ratio:.2f}x** "
            f"| {on.p50_latency_s:.2f} / {on.p95_latency_s:.2f} | {off.p50_latency_s:.2f} / {off.p95_latency_s:.2f} "
            f"| {on.p50_ttft_s:.2f} | {off.p50_ttft_s:.2f} | {on.mean_accepted:.2f} "
            f"| {on.failures} / {off.failures} | {_identical(lv)} |")
    return "\n".join(rows) + "\n"


def plot(levels: list[Level], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = [lv.concurrency for lv in levels]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax1.plot(c, [lv.ratio for lv in levels], "o-", color="tab:green")
    ax1.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax1.set(xscale="log", xlabel="concurrent clients", ylabel="speedup (on / off tok/s)", title="Lookahead speedup")
    ax1.set_xticks(c, [str(x) for x in c])
    ax2.plot(c, [lv.on.tok_s for lv in levels], "o-", label="lookahead on")
    ax2.plot(c, [lv.off.tok_s for lv in levels], "s--", label="lookahead off")
    ax2.set(xscale="log", xlabel="concurrent clients", ylabel="generated tokens/s", title="Throughput")
    ax2.set_xticks(c, [str(x) for x in c])
    ax2.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _identical(lv) -> str:
    return "sampled" if lv.identical is None else f"{'yes' if lv.identical else 'NO'} ({lv.compared})"
