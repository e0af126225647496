#!/usr/bin/env bash
# dfim-base v4 against v3, through the server, the gate off for lines (as v3 was measured).
cd /work/main
M=/work/runs/v4/export-int8
O=/work/runs/cmp-v4
S='{"inline": {"gate": {"enabled": false}}}'
E=".venv/bin/python scripts/eval_through_server.py --dev --kind midline --limit 200"
set -x
.venv/bin/python scripts/eval_through_server.py /work/shared/data/humaneval-infilling/HumanEval-SingleLineInfilling.jsonl.gz --limit 1033 --model $M --out $O/dfim-base-v4-humaneval.jsonl
$E --model $M --source .corpus/heldout/ts_js --glob '**/*.ts' --language typescript --settings "$S" --out $O/dfim-base-v4-lines-typescript.jsonl
$E --model $M --source .corpus/heldout/go --glob '**/*.go' --language go --settings "$S" --out $O/dfim-base-v4-lines-go.jsonl
$E --model $M --source .corpus/heldout/rust --glob '**/*.rs' --language rust --settings "$S" --out $O/dfim-base-v4-lines-rust.jsonl
$E --model $M --source .corpus/heldout/java --glob '**/*.java' --language java --settings "$S" --out $O/dfim-base-v4-lines-java.jsonl
$E --model $M --source .corpus/heldout/c_cpp/lua5.4 --glob '**/*.c' --language c --settings "$S" --out $O/dfim-base-v4-lines-c.jsonl
$E --model $M --source .corpus/heldout/c_cpp/leveldb --glob '**/*.cc' --language cpp --settings "$S" --out $O/dfim-base-v4-lines-cpp.jsonl
for m in /work/runs/v4/export-int8 /work/runs/base-v3-int8; do
  $E --model $m --language python --settings "$S" --out $O/lines-python-$(basename $(dirname $m))-$(basename $m).jsonl
done
