#!/usr/bin/env bash
# examples/mnist_mlp end to end on the CPU: a short run on a subset of
# Fashion-MNIST must lower the loss and reach a test accuracy threshold, and
# bad input must fail with a message that names the file.
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

echo "PASS: loss $first -> $last, test accuracy $acc%, resume reproduces epoch 3"
