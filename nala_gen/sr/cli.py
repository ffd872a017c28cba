"""``nala-sr``: train, test and prepare data for NaLaSR / ESRT.

nala-sr train -opt options/train/NaLaSR/train_NaLaSR_light_x4_mini.yml [--auto_resume] [...BasicSR flags]
nala-sr test  -opt options/test/NaLaSR/test_NaLaSR_light_x4_mini.yml
nala-sr prepare mini [datasets/mini]
nala-sr prepare div2k datasets/DIV2K [--lmdb]
nala-sr prepare benchmark HR_FOLDER datasets/Set5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _scales(text: str) -> list[int]:
    scales = [int(s) for s in text.split(",")]
    if any(s not in (2, 3, 4) for s in scales):
        raise argparse.ArgumentTypeError("scales must be among 2, 3, 4")
    return scales


def prepare(argv: list[str]) -> int:
    from . import data

    parser = argparse.ArgumentParser(prog="nala-sr prepare", description="Make datasets in BasicSR's layouts.")
    sub = parser.add_subparsers(dest="what", required=True)
    mini = sub.add_parser("mini", help="the embedded set from scikit-image / scikit-learn photos")
    mini.add_argument("out", nargs="?", type=Path, default=Path("datasets/mini"))
    mini.add_argument("--limit", type=int, help="only the first N images of each split")
    div2k = sub.add_parser("div2k", help="DIV2K sub-images and bicubic LR (ROOT/DIV2K_train_HR must exist)")
    div2k.add_argument("root", type=Path)
    div2k.add_argument("--crop", type=int, default=480)
    div2k.add_argument("--step", type=int, default=240)
    div2k.add_argument("--lmdb", action="store_true", help="also pack every folder as LMDB with meta_info.txt")
    bench = sub.add_parser("benchmark", help="GTmod12 + LRbicx{2,3,4} from any folder of HR images")
    bench.add_argument("hr_dir", type=Path)
    bench.add_argument("out", type=Path)
    for p in (mini, div2k, bench):
        p.add_argument("--scales", type=_scales, default=[2, 3, 4], help="comma-separated, e.g. 2,4")
    args = parser.parse_args(argv)

    if args.what == "mini":
        counts = data.prepare_mini(args.out, args.scales, limit=args.limit)
        where = args.out
    elif args.what == "div2k":
        counts = data.prepare_div2k(args.root, args.scales, args.crop, args.step, args.lmdb)
        where = args.root
    else:
        counts = data.prepare_benchmark(args.hr_dir, args.out, args.scales)
        where = args.out
    print(f"wrote {', '.join(f'{v} {k}' for k, v in counts.items())} under {where}")
    return 0


def _basicsr(entry: str, argv: list[str]) -> int:
    """Run BasicSR's own pipeline; it parses sys.argv itself."""
    sys.argv = [f"nala-sr {entry}", *argv]
    if entry == "train":
        from .train import main as run
    else:
        from .test import main as run
    run()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("train", "test", "prepare"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    try:
        if command == "prepare":
            return prepare(rest)
        return _basicsr(command, rest)
    except (FileNotFoundError, ValueError) as err:
        print(f"nala-sr {command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
