#!/usr/bin/env bash
# examples/mnist_mlp end to end on the CPU: a short run on a subset of
# Fashion-MNIST must lower the loss and reach a test accuracy threshold, in
# fp32 and in mixed precision (bf16, fp16), and bad input (files, flags,
# precision flags that cannot go together) must fail with a message.
#   usage: mnist_example.sh PATH/TO/mnist_mlp
# MNIST_DATA overrides the data set directory. A missing data set is a
# failure, not a skip: CI installs dataset-fashion-mnist.
set -u
bin=${1:?usage: mnist_example.sh PATH/TO/mnist_mlp}
data=${MNIST_DATA:-/usr/share/datasets/fashion-mnist}
. "$(dirname "$0")/mnist_common.sh"
need_inputs "$bin" "$data"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. A short run: 3000 images, 2 epochs of 24 steps (batch 128).
limit=3000 batch=128 epochs=2
steps=$(( (limit + batch - 1) / batch ))
"$bin" --cpu --data "$data" --train-limit $limit --batch $batch --epochs $epochs \
  --seed 7 --csv "$work/loss.csv" > "$work/out.txt" 2>&1
rc=$?
cat "$work/out.txt"
[ $rc -eq 0 ] || fail "training run exited with $rc"

check_loss_falls "$work/loss.csv" $steps $epochs "one process"
acc=$(check_accuracy "$work/out.txt" "one process") || exit 1
loss_first=$first loss_last=$last # check_loss_falls sets first, last

# 2. A directory without the data set: nonzero exit, the file named.
"$bin" --cpu --data "$work/nowhere" > "$work/bad.txt" 2>&1
rc=$?
cat "$work/bad.txt"
[ $rc -ne 0 ] || fail "a missing data set exited with 0"
grep -q "$work/nowhere/train-images-idx3-ubyte" "$work/bad.txt" ||
  fail "the error message does not name the missing file"

# 3. A truncated image file: nonzero exit, the file named.
mkdir "$work/cut"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  if [ -e "$data/$f.gz" ]; then cp "$data/$f.gz" "$work/cut/"; else cp "$data/$f" "$work/cut/"; fi
done
if [ -e "$work/cut/t10k-images-idx3-ubyte.gz" ]; then
  gzip -dc "$work/cut/t10k-images-idx3-ubyte.gz" | head -c 5000 | gzip > "$work/cut/t.gz" &&
    mv "$work/cut/t.gz" "$work/cut/t10k-images-idx3-ubyte.gz"
else
  head -c 5000 "$data/t10k-images-idx3-ubyte" > "$work/cut/t10k-images-idx3-ubyte"
fi
"$bin" --cpu --data "$work/cut" --train-limit 100 > "$work/cut.txt" 2>&1
rc=$?
cat "$work/cut.txt"
[ $rc -ne 0 ] || fail "a truncated file exited with 0"
grep -q "t10k-images-idx3-ubyte.*truncated" "$work/cut.txt" ||
  fail "the error message does not name the truncated file"

# 4. A bad flag value: nonzero exit, the flag named.
"$bin" --batch zero > "$work/flag.txt" 2>&1 && fail "--batch zero exited with 0"
grep -q -- "--batch" "$work/flag.txt" || fail "the error message does not name --batch"

# 5. Checkpoint and resume: 2 epochs, save, resume for a 3rd must match 3
# epochs in one go (constant lr, one BLAS thread: the same arithmetic).
common=(--cpu --data "$data" --train-limit 2000 --threads 1 --schedule constant --seed 3)
"$bin" "${common[@]}" --epochs 3 > "$work/straight.txt" 2>&1 || fail "3-epoch run failed"
"$bin" "${common[@]}" --epochs 2 --save "$work/ck.mtopt" > "$work/first.txt" 2>&1 ||
  fail "2-epoch run with --save failed"
"$bin" "${common[@]}" --epochs 3 --resume "$work/ck.mtopt" > "$work/resumed.txt" 2>&1 ||
  fail "--resume run failed: $(cat "$work/resumed.txt")"
grep "resumed from" "$work/resumed.txt"
# epoch number, train loss, train and test accuracy of epoch 3, and the final line
summary() { awk '$1 == "3" && NF == 8 { print $1, $2, $3, $4 } /^test accuracy/' "$1"; }
s1=$(summary "$work/straight.txt") s2=$(summary "$work/resumed.txt")
echo "straight: $s1"
echo "resumed:  $s2"
[ -n "$s1" ] && [ "$s1" = "$s2" ] || fail "resuming from a checkpoint did not reproduce epoch 3"

# 6. Mixed precision trains: the run of step 1 with bf16 weights, gradients
# and state (stochastic rounding, no master), and with fp16 weights and
# gradients (fp32 masters, the dynamic loss scale): the loss falls, the
# accuracy passes the bar and stays within 3 points of fp32's.
for cfg in "bf16 --rounding stochastic --state-dtype bf16" "fp16 --master f32"; do
  label="--precision $cfg"
  # shellcheck disable=SC2086 # cfg is a list of flags
  "$bin" --cpu --data "$data" --train-limit $limit --batch $batch --epochs $epochs \
    --seed 7 --precision $cfg --csv "$work/mp.csv" > "$work/mp.txt" 2>&1
  rc=$?
  cat "$work/mp.txt"
  [ $rc -eq 0 ] || fail "$label: training run exited with $rc"
  grep -q "^precision ${cfg%% *} " "$work/mp.txt" || fail "$label: no 'precision' line in the output"
  check_loss_falls "$work/mp.csv" $steps $epochs "$label"
  mp_acc=$(check_accuracy "$work/mp.txt" "$label") || exit 1
  awk -v a="$mp_acc" -v b="$acc" 'BEGIN { exit !(a > b - 3.0) }' ||
    fail "$label: test accuracy $mp_acc% is more than 3 points below fp32's $acc%"
done

# 7. Precision flags that cannot go together: nonzero exit, a message that
# says why. The library refuses remainders of fp16 weights (its message comes
# through); the example refuses flags that would do nothing.
bad_combo() { # expected message, flags...
  local want=$1; shift
  "$bin" --cpu --data "$data" --train-limit 100 --epochs 1 "$@" > "$work/combo.txt" 2>&1 &&
    fail "$* exited with 0"
  cat "$work/combo.txt"
  grep -q -- "$want" "$work/combo.txt" || fail "$*: the error message does not say '$want'"
}
bad_combo "MTOPT_MASTER_REMAINDER needs BF16" --precision fp16 --master remainder
bad_combo "--master f32: the weights are fp32" --master f32
bad_combo "--rounding stochastic: nothing would be rounded" --precision bf16 --master f32 \
  --rounding stochastic
bad_combo "--precision: 'fp8' is not one of" --precision fp8

echo "PASS: loss $loss_first -> $loss_last, test accuracy $acc%, resume reproduces epoch 3, bf16/fp16 train, bad precision flags refused"
