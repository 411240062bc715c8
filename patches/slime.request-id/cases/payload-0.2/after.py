# Written for rlprobe-patch: the shape of slime 0.2.x's sglang_rollout.generate (not slime's code).
import logging

logger = logging.getLogger(__name__)


async def generate(args, sample, sampling_params):
    """Generate one sample."""
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    if sampling_params["max_new_tokens"] == 0:
        return sample

    # Prepare payload for sglang server
    payload = {
        "sampling_params": sampling_params,
        "return_logprob": True,
    }
    if (
        _RlprobeSwitches()._rlprobe_run_switches()["dump_on"]  # rlprobe-patch: DUMP_ON
        and sample.index is not None
        and isinstance(sample.metadata, dict)
    ):
        _rlprobe_request_ids = sample.metadata.setdefault("rlprobe_request_ids", [])
        payload["rid"] = f"slime-{sample.index}" + (f"-{len(_rlprobe_request_ids)}" if _rlprobe_request_ids else "")
        _rlprobe_request_ids.append(payload["rid"])

    if len(sample.response) > 0:
        payload["input_ids"] = sample.tokens
    else:
        payload["input_ids"] = sample.prompt_ids

    output = await post(url, payload)
    sample.update_from_meta_info(args, output["meta_info"])
    return sample


class _RlprobeSwitches:
    # Added by rlprobe-patch (slime.request-id); `rlprobe-patch revert` removes it.
    # The switch reader (patches/_shared/switches.py, with slime's DUMP_PHASE list) for the hook
    # in `generate`, a module-level function.
    def _rlprobe_on_rank(self, environ=None):
        # " on rank N", N the rank the launcher set (RANK, else LOCAL_RANK); "" without one.
        import os

        env = os.environ if environ is None else environ
        rank = env.get("RANK") or env.get("LOCAL_RANK")
        return f" on rank {rank}" if rank else ""
    def _rlprobe_switch(self, name, environ=None):
        # True or False for the switch `name`; ValueError naming it for any other value.
        import os

        env = os.environ if environ is None else environ
        raw = env.get(name, "")
        word = raw.strip().lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("", "0", "false", "no", "off"):
            return False
        raise ValueError(
            f"rlprobe-patch: {name}={raw!r}{self._rlprobe_on_rank(env)} is not a switch value: "
            "on is one of 1, true, yes, on; off is one of 0, false, no, off, empty or unset (any case)"
        )
    def _rlprobe_switches(self, environ=None):
        # slime's switches: {"dump_on", "prompts_only", "phase", "phases", "warnings"}; DUMP_PHASE
        # is a comma-separated list of passes. ValueError naming the variable for a value that is
        # not allowed.
        import os

        env = os.environ if environ is None else environ
        dump_on = self._rlprobe_switch("DUMP_ON", env)
        prompts_only = self._rlprobe_switch("PROMPTS_ONLY", env)
        raw_phase = env.get("DUMP_PHASE", "")
        allowed = (
            "log_prob",
            "update_actor",
            "all",
            "ref_forward",
            "teacher_forward",
            "critic_forward",
            "update_critic",
        )
        phases = tuple(item.strip().lower() for item in raw_phase.split(",") if item.strip()) or ("log_prob",)
        unknown = [item for item in phases if item not in allowed]
        if unknown:
            raise ValueError(
                f"rlprobe-patch: DUMP_PHASE={raw_phase!r}{self._rlprobe_on_rank(env)}: "
                f"{', '.join(unknown)} is not a pass of slime: use a comma-separated list of "
                f"{', '.join(allowed)} (log_prob when unset)"
            )
        warnings = []
        if prompts_only:
            warnings.append(
                "rlprobe-patch: PROMPTS_ONLY is on: slime's hooks do not cut batches to their prompts; "
                "every pass runs on the whole batch"
            )
        return {
            "dump_on": dump_on,
            "prompts_only": prompts_only,
            "phase": ",".join(phases),
            "phases": phases,
            "warnings": warnings,
        }
    def _rlprobe_run_switches(self):
        # The switches of this process, read at the first hook call and kept for every hook of
        # the process: a wrong value stops the run there; warnings are printed once.
        import sys

        run = sys.modules.get("_rlprobe_patch_run")
        if run is None:
            import types

            switches = self._rlprobe_switches()
            for warning in switches["warnings"]:
                print(warning, file=sys.stderr, flush=True)
            run = types.ModuleType("_rlprobe_patch_run", "rlprobe-patch: the switches this process runs with")
            run.switches = switches
            run.announced = set()
            sys.modules["_rlprobe_patch_run"] = run
        return run.switches
