"""One vLLM engine over a checkpoint folder, greedy (every prompt its --max-tokens: EOS does
not stop it), token-id prompts; prints one JSON line.

    python tests/integrations/vllm/run_vllm.py MODEL_DIR --prompts '[[1, 2, 3], [4, 5]]' --max-tokens 16

With vLLM's plugins as the environment selects them (``VLLM_PLUGINS``): the tests run it
with and without ``tileops``. Output: per prompt, the generated ids, the top-2 log-probs of
each step (the agreement rule's margins) and the prompt's log-probs; plus the plugin's
``tileops:`` log line when there is one (read from stderr by the caller).
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--prompts", required=True, help="JSON list of token-id lists")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument(
        "--executor", default=None, help="vLLM's distributed_executor_backend (uni: the worker in the engine's process)"
    )
    parser.add_argument("--compile", action="store_true", help="vLLM's default torch.compile mode (else eager)")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams  # noqa: PLC0415

    llm = LLM(
        model=args.model,
        dtype="bfloat16",
        max_model_len=args.max_model_len,
        enforce_eager=not args.compile,
        skip_tokenizer_init=True,
        tensor_parallel_size=args.tp,
        seed=0,
        distributed_executor_backend=args.executor,
    )
    params = SamplingParams(
        temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True, logprobs=2, prompt_logprobs=0, detokenize=False
    )
    prompts = [{"prompt_token_ids": ids} for ids in json.loads(args.prompts)]
    results = []
    for out in llm.generate(prompts, params, use_tqdm=False):
        done = out.outputs[0]
        top2 = [sorted((lp.logprob for lp in step.values()), reverse=True)[:2] for step in done.logprobs]
        prompt_lps = [next(iter(step.values())).logprob for step in out.prompt_logprobs[1:]]
        results.append({"tokens": list(done.token_ids), "top2": top2, "prompt_logprobs": prompt_lps})
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
