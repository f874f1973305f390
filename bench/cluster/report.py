"""Derived figures and the printed table of bench_cluster.py."""

import statistics

GB = 1e9


def median_of(reps, key):
    return statistics.median(r[key] for r in reps)


def summarize(case, reps, static, rate_bytes, unshaped):
    """One case's figures from its repetitions (medians) and the per-case
    constants (plan stats, central plan)."""
    out = dict(case=case.name, transition=case.text(), reps=len(reps))
    out.update(static)
    for key in reps[0]:
        out[key] = median_of(reps, key)
    out["reshard_total_s"] = statistics.median(r["publish_s"] + r["resize_s"] + r["load_s"]
                                               for r in reps)
    # Zero-copy: state computed into Worker.buffers, publish = the seal;
    # load(copy=False).
    out["reshard_total_zc_s"] = statistics.median(
        r["publish_zc_s"] + r["resize_s"] + r["load_zc_s"] for r in reps)
    # Each repetition's prediction against what it took ("*": seeded rates).
    out["predictions"] = " ".join(
        f"{r['predicted_s']:.2f}/{r['op_actual_s']:.2f}{'' if r['calibrated'] else '*'}"
        for r in reps)
    calibrated = [r["op_actual_s"] / r["predicted_s"] for r in reps
                  if r["calibrated"] and r["predicted_s"] > 0]
    out["actual_over_predicted"] = statistics.median(calibrated) if calibrated else None
    busiest = max(max(h["in"], h["out"]) for h in static["hosts"].values())
    out["busiest_host_bytes"] = busiest
    if rate_bytes:
        out["network_bound_s"] = busiest / rate_bytes
        out["resize_over_bound"] = out["resize_s"] / out["network_bound_s"]
    if not unshaped:
        out["central_total_s"] = statistics.median(r["save_s"] + r["central_load_s"] for r in reps)
        out["ratio"] = out["central_total_s"] / out["reshard_total_s"]
        out["central_floor_s"] = (static["central_saved"] + static["central_needed"]) / rate_bytes
        out["allowed_ratio"] = out["central_floor_s"] / out["network_bound_s"]
        out["ratio_over_allowed"] = out["ratio"] / out["allowed_ratio"]
        out["ratio_zc"] = out["central_total_s"] / out["reshard_total_zc_s"]
        out["ratio_zc_over_allowed"] = out["ratio_zc"] / out["allowed_ratio"]
    else:
        written = static["bytes_written"]
        out["agent_cpu_s_per_gb"] = out["agent_cpu_s"] / (written / GB)
        out["resize_over_ucx_bound"] = out["resize_s"] / (static["bytes_cross_host"]
                                                          / out["ucx_tag_bw"])
        for phase in ("publish", "load"):
            out[f"{phase}_gb_s"] = out[f"{phase}_bytes"] / out[f"{phase}_s"] / GB
            out[f"{phase}_memcpy_gb_s"] = out[f"{phase}_bytes"] / out[f"{phase}_memcpy_s"] / GB
            out[f"{phase}_over_memcpy"] = out[f"{phase}_gb_s"] / out[f"{phase}_memcpy_gb_s"]
            # Zero-copy (Worker.buffers + seal; load(copy=False)): the same
            # memcpy yardstick of the same bytes.
            out[f"{phase}_zc_gb_s"] = out[f"{phase}_zc_bytes"] / out[f"{phase}_zc_s"] / GB
            out[f"{phase}_zc_over_memcpy"] = out[f"{phase}_zc_gb_s"] / out[f"{phase}_memcpy_gb_s"]
    return out


def _rows(unshaped):
    g = lambda k: (lambda r: f"{r[k] / GB:.2f}")  # noqa: E731
    s = lambda k: (lambda r: f"{r[k]:.2f}")  # noqa: E731
    x = lambda k: (lambda r: f"{r[k]:.2f}x")  # noqa: E731
    rows = [
        ("state of one replica (GB)", g("state_bytes")),
        ("resize: bytes written (GB)", g("bytes_written")),
        ("resize: cross-host (GB)", g("bytes_cross_host")),
        ("busiest host in/out (GB)", g("busiest_host_bytes")),
        ("reshard publish (s)", s("publish_s")),
        ("reshard resize (s)", s("resize_s")),
        ("reshard load (s)", s("load_s")),
        ("reshard total (s)", s("reshard_total_s")),
        ("resize predicted / actual, each rep (s)", lambda r: r["predictions"]),
        ("actual / predicted (calibrated reps)",
         lambda r: "-" if r["actual_over_predicted"] is None
         else f"{r['actual_over_predicted']:.2f}x"),
    ]
    if not unshaped:
        rows += [
            ("central saved / needed / read (GB)",
             lambda r: f"{r['central_saved'] / GB:.2f} / {r['central_needed'] / GB:.2f} / "
                       f"{r['central_read'] / GB:.2f}"),
            ("central save (s)", s("save_s")),
            ("central load (s)", s("central_load_s")),
            ("central total (s)", s("central_total_s")),
            ("ratio central / reshard", x("ratio")),
            ("network bound of resize (s)", s("network_bound_s")),
            ("resize / network bound", x("resize_over_bound")),
            ("central floor (s)", s("central_floor_s")),
            ("allowed ratio (floor / bound)", x("allowed_ratio")),
            ("achieved / allowed ratio", x("ratio_over_allowed")),
            ("reshard publish / load, zero-copy (s)",
             lambda r: f"{r['publish_zc_s']:.2f} / {r['load_zc_s']:.2f}"),
            ("reshard total, zero-copy (s)", s("reshard_total_zc_s")),
            ("ratio central / reshard, zero-copy", x("ratio_zc")),
            ("achieved / allowed ratio, zero-copy", x("ratio_zc_over_allowed")),
        ]
    else:
        rows += [
            ("agents CPU-s per GB written", s("agent_cpu_s_per_gb")),
            ("ucx_perftest tag_bw (GB/s)", lambda r: f"{r['ucx_tag_bw'] / GB:.2f}"),
            ("resize / (cross-host / tag_bw)", x("resize_over_ucx_bound")),
            ("publish GB/s (memcpy GB/s)",
             lambda r: f"{r['publish_gb_s']:.2f} ({r['publish_memcpy_gb_s']:.2f})"),
            ("publish / memcpy", x("publish_over_memcpy")),
            ("load GB/s (memcpy GB/s)",
             lambda r: f"{r['load_gb_s']:.2f} ({r['load_memcpy_gb_s']:.2f})"),
            ("load / memcpy", x("load_over_memcpy")),
            ("zero-copy publish (seal) GB/s", lambda r: f"{r['publish_zc_gb_s']:.2f}"),
            ("zero-copy publish / memcpy", x("publish_zc_over_memcpy")),
            ("zero-copy load GB/s", lambda r: f"{r['load_zc_gb_s']:.2f}"),
            ("zero-copy load / memcpy", x("load_zc_over_memcpy")),
            ("reshard total, zero-copy (s)", s("reshard_total_zc_s")),
        ]
    return rows


def table(results, unshaped, title):
    """The printed table: one column per case, one row per figure."""
    head = [""] + [r["case"] for r in results]
    body = [[label] + [fmt(r) for r in results] for label, fmt in _rows(unshaped)]
    widths = [max(len(row[i]) for row in [head] + body) for i in range(len(head))]
    lines = [title]
    for r in results:
        lines.append(f"  {r['case']}: {r['transition']} (median of {r['reps']})")
    lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                  for i, (c, w) in enumerate(zip(head, widths))))
    for row in body:
        lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                      for i, (c, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)
