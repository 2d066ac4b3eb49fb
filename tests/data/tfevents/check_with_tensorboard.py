#!/usr/bin/env python3
# Reads event files written by trainkit with TensorBoard's own loaders and compares them with the
# expectations the C++ test wrote (tests/monitor/test_tfevents.cpp, "TensorBoard reads our files").
#   check_with_tensorboard.py EXPECTED_JSON
# EXPECTED_JSON: {"runs": {"<run dir>": {"scalars": {tag: [[step, value], ...]},
#                 "histograms": {tag: [{"step", "min", "max", "num", "sum", "sum_squares",
#                                        "bucket_limit", "bucket"}]},
#                 "texts": {tag: [[step, text], ...]}, "hparams": {name: value},
#                 "metric_tags": [...]}}}
# Exit status 0 when every run matches, 1 with a message per mismatch otherwise. Needs only
# `tensorboard` (and numpy, which it depends on); no TensorFlow.
import json
import math
import sys

from tensorboard.backend.event_processing import event_accumulator as ea_classic
from tensorboard.backend.event_processing import plugin_event_accumulator as ea_plugin
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util import tensor_util

failures = []


def check(cond, message):
    if not cond:
        failures.append(message)
    return cond


def close(a, b, rel=1e-6):
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-30)


def plugin_content(accumulator, plugin_name):
    try:
        return accumulator.PluginTagToContent(plugin_name)
    except KeyError:  # no tag of that plugin in the run
        return {}


def check_run(path, want):
    classic = ea_classic.EventAccumulator(path, size_guidance={
        ea_classic.SCALARS: 0, ea_classic.HISTOGRAMS: 0, ea_classic.TENSORS: 0})
    classic.Reload()
    # The accumulator the TensorBoard server uses: migrates simple_value/histo to plugin tensors.
    plugin = ea_plugin.EventAccumulator(path, size_guidance={ea_plugin.TENSORS: 0})
    plugin.Reload()
    tags = classic.Tags()

    for tag, points in want.get("scalars", {}).items():
        if not check(tag in tags["scalars"], f"{path}: scalar tag {tag!r} missing; have {tags['scalars']}"):
            continue
        got = [(e.step, e.value) for e in classic.Scalars(tag)]
        check(len(got) == len(points), f"{path}: {tag}: {len(got)} points, want {len(points)}")
        for (gs, gv), (ws, wv) in zip(got, points):
            check(gs == ws and close(gv, wv), f"{path}: {tag}: got ({gs}, {gv}), want ({ws}, {wv})")
        check(tag in plugin_content(plugin, "scalars"),
              f"{path}: {tag} is not filed under the scalars plugin")

    for tag, hists in want.get("histograms", {}).items():
        if not check(tag in tags["histograms"], f"{path}: histogram tag {tag!r} missing"):
            continue
        got = classic.Histograms(tag)
        check(len(got) == len(hists), f"{path}: {tag}: {len(got)} histograms, want {len(hists)}")
        for g, w in zip(got, hists):
            h = g.histogram_value
            check(g.step == w["step"], f"{path}: {tag}: step {g.step}, want {w['step']}")
            for field in ("min", "max", "num", "sum", "sum_squares"):
                check(close(getattr(h, field), w[field], 1e-12),
                      f"{path}: {tag}: {field} {getattr(h, field)}, want {w[field]}")
            check(list(h.bucket_limit) == w["bucket_limit"], f"{path}: {tag}: bucket_limit differs")
            check(list(h.bucket) == w["bucket"], f"{path}: {tag}: bucket differs")
        check(tag in plugin_content(plugin, "histograms"),
              f"{path}: {tag} is not filed under the histograms plugin")

    texts = plugin_content(plugin, "text")
    for tag, entries in want.get("texts", {}).items():
        full = tag + "/text_summary"
        if not check(full in texts, f"{path}: text tag {full!r} missing; have {list(texts)}"):
            continue
        got = [(e.step, tensor_util.make_ndarray(e.tensor_proto).reshape(-1)[0].decode("utf-8"))
               for e in plugin.Tensors(full)]
        check(got == [tuple(x) for x in entries], f"{path}: {full}: got {got}, want {entries}")

    if "hparams" in want:
        content = plugin_content(plugin, "hparams")
        check("_hparams_/experiment" in content, f"{path}: hparams experiment missing")
        check("_hparams_/session_start_info" in content, f"{path}: hparams session start missing")
        if "_hparams_/experiment" in content:
            exp = plugin_data_pb2.HParamsPluginData.FromString(
                content["_hparams_/experiment"]).experiment
            check(sorted(h.name for h in exp.hparam_infos) == sorted(want["hparams"]),
                  f"{path}: hparam names {[h.name for h in exp.hparam_infos]}")
            check(sorted(m.name.tag for m in exp.metric_infos) == sorted(want["metric_tags"]),
                  f"{path}: metric tags {[m.name.tag for m in exp.metric_infos]}")
        if "_hparams_/session_start_info" in content:
            ssi = plugin_data_pb2.HParamsPluginData.FromString(
                content["_hparams_/session_start_info"]).session_start_info
            for name, value in want["hparams"].items():
                if not check(name in ssi.hparams, f"{path}: hparam {name} missing in session"):
                    continue
                v = ssi.hparams[name]
                kind = v.WhichOneof("kind")
                got = {"number_value": v.number_value, "string_value": v.string_value,
                       "bool_value": v.bool_value}.get(kind)
                check(got == value, f"{path}: hparam {name} = {got!r}, want {value!r}")


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    for path, want in spec["runs"].items():
        check_run(path, want)
    if failures:
        print("\n".join(failures))
        return 1
    print(f"tensorboard read {len(spec['runs'])} run(s): OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
