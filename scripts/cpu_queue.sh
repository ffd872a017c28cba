#!/usr/bin/env bash
# The long runs of the open issues, in the order the CPU serves them, as two streams (one per core):
#
#   OMP_NUM_THREADS=1 nohup nice -n 10 scripts/cpu_queue.sh A > logs/queue_A.log 2>&1 &
#   OMP_NUM_THREADS=1 nohup nice -n 10 scripts/cpu_queue.sh B > logs/queue_B.log 2>&1 &
#
# Every step resumes where it stopped (checkpoints) and passes by what is finished (ledgers) or being run by the
# other stream (locks), so after any stop the same two commands carry on. (The whole script is one function, read
# before it runs, so editing the file does not disturb a stream that is running it.) The streams list the same work in
# different orders, so the two cores do not wait on one run.
#   1. NaLaDiT ablation seeds (issue 14): nala, nala + tracked norm scale, softmax x 3 seeds, 6,000 steps each.
#   2. Peer board quality (issue 20), 1,000 iterations x 3 seeds each: SRVGGNetCompact from its zero init and
#      SwinIR-light, then the held-out photo scores of NaLaSR, ESRT and EDSR (retrained from their seeded options
#      where the checkpoint is gone).
#   3. The photo set's trainings (issue 18): stage 3 of the shipped x4 pair, NaLaSR-light and ESRT, same budget and
#      seed, from their stage-2 checkpoints (experiments/*_x4_mini_ft; make weights-sr trains stages 1 and 2); then
#      stage 2 of the shipped x2 (NaLaSR-light; stream A only), from its stage-1 checkpoint (experiments/NaLaSR_light_x2_mini).
#      The from-scratch 60,000-iteration *_photos.yml runs (about 25 h each) are for a machine kept that long.
set -euo pipefail

main() {
    cd "$(dirname "$0")/.."
    BIN=.venv/bin
    stream=${1:?usage: scripts/cpu_queue.sh A|B}
    case $stream in
        A) dit_seeds=(1 2 0); sr_seeds=(0 1 2); photos=(NaLaSR/train_NaLaSR_light_x4_photos_ft NaLaSR/train_NaLaSR_light_x2_photos_ft) ;;
        B) dit_seeds=(2 1 0); sr_seeds=(2 1 0); photos=(ESRT/train_ESRT_x4_photos_ft) ;;
        *) echo "scripts/cpu_queue.sh: stream must be A or B, got '$stream'" >&2; exit 2 ;;
    esac
    echo "== $(date -u +%FT%TZ) stream $stream: DiT ablation"
    $BIN/nala-bench dit-ablation --seeds "${dit_seeds[@]}" --variants nala nala_norm_tracked softmax
    echo "== $(date -u +%FT%TZ) stream $stream: peer quality (mini val and held-out photos)"
    $BIN/nala-bench sr-ablation --iters 1000 --variants srvgg_zero_init swinir nala emha edsr --seeds "${sr_seeds[@]}" --photos
    for option in "${photos[@]}"; do
        echo "== $(date -u +%FT%TZ) stream $stream: $option"
        $BIN/nala-sr train -opt "options/train/$option.yml" --auto_resume
    done
    echo "== $(date -u +%FT%TZ) stream $stream: done"
}

main "$@"
exit $?
