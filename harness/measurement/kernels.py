"""Where a question's time goes, kernel by kernel (`memdefrag-bench --profile FILE`): one more question per method
under torch.profiler, its kernels (a GPU's, copies and fills among them, else the CPU's operators by their own
time) ranked by time, with how many ran. A decode step at several times its floor is either many small kernels
one after another or one kernel that reads its data slowly (an attention kernel over a long memory with too few
blocks to fill the device); the table tells which."""

from __future__ import annotations

import pandas as pd
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

NAME = 100          # characters of a kernel's name kept (CUDA's templated names run to hundreds)


def kernels(session, question: str, top: int) -> pd.DataFrame:
    """The `top` kernels of one answer to `question` by their total time, then one row for all of them: name,
    calls, milliseconds, share of the kernels' time."""
    cuda = session.model.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as trace:
        session.ask(question)
        if cuda:
            torch.cuda.synchronize(session.model.device)
    kind = DeviceType.CUDA if cuda else DeviceType.CPU
    own = [(e.key[:NAME], e.count, (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1000)
           for e in trace.key_averages() if e.device_type == kind]
    table = (pd.DataFrame(own, columns=["kernel", "calls", "ms"]).groupby("kernel", as_index=False).sum()
             .sort_values("ms", ascending=False))
    total = table["ms"].sum()
    table = pd.concat([table.head(top), pd.DataFrame([{"kernel": "(all)", "calls": table["calls"].sum(),
                                                       "ms": total}])])
    return table.assign(share=table["ms"] / total if total else None)
