"""CLEANER at cluster scale, in verl (tested against verl 0.9.1; `pip install 'cleaner[verl]'`).

verl runs the models (FSDP or Megatron actors, vLLM or SGLang rollout replicas) and the policy
update; cleaner supplies the agent loop: its rollout with online SAAR over verl's replicas, its
sandbox, and its rewards. Three steps:

    # 1. data: problems as verl rows that name the cleaner_agent loop
    cleaner to-verl --data gym -o train.parquet
    cleaner to-verl --data aime2025 --root Open-AgentRL-Eval --split test -o test.parquet

    # 2. train with verl, pointing its agent loop config at cleaner's
    python -m verl.trainer.main_ppo \\
        algorithm.adv_estimator=grpo \\
        data.train_files=train.parquet data.val_files=test.parquet data.return_raw_chat=True \\
        actor_rollout_ref.model.path=Gen-Verse/Qwen3-4B-RA-SFT \\
        actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async \\
        actor_rollout_ref.rollout.calculate_log_probs=True \\
        actor_rollout_ref.rollout.agent.agent_loop_config_path=$(python -c \\
            "import cleaner.integrations.verl as v; print(v.AGENT_LOOP_CONFIG)") \\
        ...  # the rest of the recipe: batch sizes, clip ratios, response_length (20480)

    # 3. the loop's own settings (SAAR, tool format, sandbox) come from a cleaner recipe: copy
    #    AGENT_LOOP_CONFIG and set `cleaner_config:` and `overrides:` in it

Pieces, each usable alone: `engine.VerlEngine` (cleaner's `Engine` over verl's server manager),
`convert` (rows and outputs, pure), `agent_loop.CleanerAgentLoop` (imports verl), and
`reward.compute_score` (cleaner's grading as verl's `custom_reward_function`, for verl's own loops).

What verl then does with the output matches `cleaner train`'s `graft_mode=recompute`: grafted tokens
are trained (mask 1), their old log-probs recomputed by the actor, tool output masked. The
reference log-probs verl logs for rollout-vs-actor mismatch (`rollout_log_probs`) are the ones each
token was sampled with, the error still in view for grafted ones (SPEC section 2).
"""

from pathlib import Path

AGENT_LOOP_CONFIG = Path(__file__).with_name("agent_loop.yaml")
"""verl's `actor_rollout_ref.rollout.agent.agent_loop_config_path` for the `cleaner_agent` loop."""
