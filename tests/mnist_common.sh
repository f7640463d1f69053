# Shared by the examples/mnist_mlp test scripts (sourced, not run).

fail() { echo "FAIL: $*" >&2; exit 1; }

# need_inputs BIN DATA: the binary was built and the data set is there. A
# missing data set is a failure, not a skip: CI installs dataset-fashion-mnist.
need_inputs() {
  [ -x "$1" ] || fail "$1 was not built (the example needs OpenBLAS and zlib: apt install libopenblas-dev zlib1g-dev)"
  [ -d "$2" ] || fail "no data set at $2 (apt install dataset-fashion-mnist, or set MNIST_DATA)"
}

# accuracy_of FILE: NN.NN from the line 'test accuracy: NN.NN%' (empty if none).
accuracy_of() { sed -n 's/^test accuracy: \([0-9][0-9]*\.[0-9][0-9]\)%$/\1/p' "$1"; }

# check_loss_falls CSV STEPS EPOCHS LABEL: the loss CSV (header, then one row
# per step) has STEPS x EPOCHS rows, all numbers, and the last epoch's mean
# loss is below 80% of the first epoch's.
check_loss_falls() {
  local csv=$1 steps=$2 epochs=$3 label=$4 rows  # sets first, last
  rows=$(( $(wc -l < "$csv") - 1 ))
  [ "$rows" -eq $((steps * epochs)) ] || fail "$label: loss.csv has $rows rows, expected $((steps * epochs))"
  read -r first last < <(awk -F, -v s="$steps" -v n="$rows" '
    NR > 1 && NR - 1 <= s { a += $2 }
    NR > 1 && NR - 1 > n - s { b += $2 }
    NR > 1 && ($2 != $2 + 0 || $2 + 0 != $2 + 0) { bad = 1 }
    END { if (bad) print "nan nan"; else printf "%.6f %.6f\n", a / s, b / s }' "$csv")
  echo "$label: mean loss first epoch $first, last epoch $last"
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b > 0 && b < 0.8 * a) }' ||
    fail "$label: the loss did not fall by 20% (first epoch $first, last epoch $last)"
}

# check_accuracy FILE LABEL: a 'test accuracy' line above 70%; prints it.
check_accuracy() {
  local acc
  acc=$(accuracy_of "$1")
  [ -n "$acc" ] || fail "$2: no line 'test accuracy: NN.NN%' in the output"
  awk -v a="$acc" 'BEGIN { exit !(a > 70.0) }' || fail "$2: test accuracy $acc% is not above 70%"
  echo "$acc"
}
