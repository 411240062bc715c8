# Case: SGLang 0.4.6 to 0.5.3 (`ret = cls(...)`, then an early `return ret` for idle batches).
from dataclasses import dataclass


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int

    @classmethod
    def init_new(cls, batch: ModelWorkerBatch, model_runner: ModelRunner):
        device = model_runner.device
        ret = cls(
            forward_mode=batch.forward_mode,
            batch_size=len(batch.seq_lens),
        )
        ret.rids = getattr(batch, "rids", None)  # rlprobe-patch
        if ret.forward_mode.is_idle():
            return ret

        ret.extend_seq_lens_cpu = batch.extend_seq_lens
        return ret
