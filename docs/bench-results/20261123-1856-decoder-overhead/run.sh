#!/bin/bash
# A/B: decode tok/s of SmolLM2 on cpu (float activations) before the decoder generalisation (5a13e3c) and now.
out=ab12.txt; : > $out
for tree in wt-before12 .; do  # warm-up: numba caches
  (cd $tree && INFERDESK_CPU_ACTIVATIONS=float PYTHONPATH=$tree .venv/bin/python -m inference.bench --backend cpu --threads 2 --rounds 1 --only llm > /dev/null 2>&1)
done
for i in 1 2 3; do
  for tree in wt-before12 .; do
    (cd $tree && INFERDESK_CPU_ACTIVATIONS=float PYTHONPATH=$tree .venv/bin/python -m inference.bench --backend cpu --threads 2 --rounds 3 --only llm > ab12-$(basename $tree)-$i.json 2>/dev/null)
    python3 -c "import json,sys; d=json.load(open('ab12-$(basename $tree)-$i.json')); print('$tree', $i, d['llm']['inferdesk']['decode_tok_s'], d['llm']['inferdesk']['prefill_tok_s'], d['machine']['loadavg_1m_at_start'])" >> $out
  done
done
