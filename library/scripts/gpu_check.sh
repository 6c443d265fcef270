#!/usr/bin/env bash
# The GPU proof in one command, for a single-GPU node with no network (a common air-gapped cluster node):
# install the template (its library, then its project) offline from wheels kept beside it, then run
# library/scripts/gpu_check.py (JSON + log in runs/gpu_check/).
#
#   on a machine with network, once:   bash library/scripts/gpu_check.sh --download    # fills wheels/
#   on the GPU node:                   bash library/scripts/gpu_check.sh        # --install-only: stop before the check
#
# Such nodes often have torch, Lightning, torchmetrics and scikit-learn but not jsonargparse and its extras, nor
# torchdata: those come from wheels/. Nothing is downloaded on the GPU node (--no-index), nothing replaces its torch
# (--no-deps for torchdata, whose loader needs none of its other requirements, and for the library and the project).
# library/tests/test_gpu_check_install.py simulates such a node on CPU.
set -euo pipefail
cd "$(dirname "$0")/../.."  # the template
WHEELS=${WHEELS:-wheels}
if [[ ${1:-} == --download ]]; then
  python -m pip download -d "$WHEELS" "jsonargparse[signatures]>=4.27" "rich>=12" "docstring-parser" "typeshed-client"
  python -m pip download -d "$WHEELS" --no-deps "torchdata>=0.8"
  python -m pip download -d "$WHEELS" "setuptools>=70.1"  # builds the editable install without the wheel package
  exit 0
fi
python -m pip install -q --no-index --find-links "$WHEELS" "jsonargparse[signatures]>=4.27" "rich>=12"
python -m pip install -q --no-index --no-deps --find-links "$WHEELS" "torchdata>=0.8"
python -m pip install -q --no-index --find-links "$WHEELS" "setuptools>=70.1"
python -m pip install -q --no-index --no-deps --no-build-isolation -e library -e .
[[ ${1:-} == --install-only ]] && exit 0
python library/scripts/gpu_check.py "$@"
