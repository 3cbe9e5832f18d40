"""Contrastive fine-tuning on DeepSpeed: the loop that training, self-slimming, retraining and
self-distillation share.

    deepspeed --num_gpus 2 launchers/train.py --config train.yaml [--option value ...]
    torchrun --nproc_per_node 2 launchers/train.py --config train.yaml
    deepspeed --hostfile hosts --num_nodes 2 --num_gpus 8 launchers/train.py --config train.yaml

``arguments`` (options), ``data`` (groups, deterministic schedule, collator through ``Encoder.tokenize``),
``loop`` (the run as named phases, with ``Hooks``), ``engine`` (DeepSpeed: process group, config, engine,
checkpoints), ``runlog`` (log.jsonl and TensorBoard), ``slim`` (self-slimming and masked retraining as
``Hooks``), ``distill`` (self-distillation from a teacher's cached embeddings, ``--mode distill``),
``gradcache`` (in-batch losses over large batches at one chunk's memory, ``--grad_cache_chunk``), ``lora``
(attach / merge), ``mine`` (hard negatives), ``evaluate`` (in-training nDCG@10).
A run folder holds ``checkpoints/``, ``tensorboard/``, ``log.jsonl``, ``train_args.json``, ``adapter/``
(LoRA), ``model/`` (a dsprune export) and ``manifest.json``.
"""
