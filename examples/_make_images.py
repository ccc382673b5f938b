"""Make the small copies of the examples' figures that examples/README.md shows (examples/images/).

    python examples/_make_images.py --from examples/output        # after running the examples at full size
    python examples/_make_images.py --run [--quick]                # run every example first

PNGs are re-saved with an adaptive palette (they are flat-colour plots); the GIF is resized and given one
palette for all frames, which keeps it far below the GIF that ``hmc_animation.py`` writes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from PIL import Image, ImageSequence

HERE = Path(__file__).resolve().parent
FIGURES = {  # example -> figures it writes, relative to its --out
    "coin_toss_convergence": ["coin_toss_convergence.png"],
    "hmc_animation": ["hmc_animation.gif"],
    "linear_acceleration": ["linear_acceleration.png"],
    "eight_schools": ["eight_schools_funnel.png", "eight_schools_trace.png"],
    "scaling_study": ["scaling_study.png"],
    "xarray_analysis": ["xarray_analysis.png"],
    "bambi_hierarchical": ["bambi_hierarchical.png"],
}
LIMIT = 300_000  # bytes per image


def small_png(src: Path, dst: Path) -> None:
    image = Image.open(src).convert("RGB")
    for colours in (256, 128, 64):
        image.quantize(colors=colours, method=Image.Quantize.MEDIANCUT).save(dst, optimize=True)
        if dst.stat().st_size < LIMIT:
            return
    scale = (LIMIT / dst.stat().st_size) ** 0.5
    image.resize((int(image.width * scale), int(image.height * scale)), Image.LANCZOS).quantize(64).save(dst)


def small_gif(src: Path, dst: Path, size: int = 320, colours: int = 32) -> None:
    gif = Image.open(src)
    duration = gif.info.get("duration", 250)
    frames = [f.convert("RGB").resize((size, size), Image.LANCZOS) for f in ImageSequence.Iterator(gif)]
    for step in (1, 2, 3, 4):
        kept = frames[::step] if step > 1 else frames
        picks = [kept[min(i, len(kept) - 1)] for i in (1, len(kept) // 8, len(kept) // 3, len(kept) - 1)]
        montage = Image.new("RGB", (size * len(picks), size))
        for i, frame in enumerate(picks):
            montage.paste(frame, (i * size, 0))
        palette = montage.quantize(colors=colours, method=Image.Quantize.MAXCOVERAGE)
        out = [f.quantize(palette=palette, dither=Image.Dither.NONE) for f in kept]
        out[0].save(dst, save_all=True, append_images=out[1:], duration=duration * step, loop=0, optimize=True)
        if dst.stat().st_size < LIMIT:
            return


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", default=str(HERE / "output"), help="the examples' --out folder")
    parser.add_argument("--run", action="store_true", help="run every example first (into --from/NAME)")
    parser.add_argument("--quick", action="store_true", help="with --run: the --quick sizes")
    parser.add_argument("--to", default=str(HERE / "images"))
    args = parser.parse_args(argv)
    source, target = Path(args.source), Path(args.to)
    target.mkdir(parents=True, exist_ok=True)
    for name, files in FIGURES.items():
        folder = source / name
        if args.run:
            cmd = [sys.executable, str(HERE / f"{name}.py"), "--out", str(folder)] + (["--quick"] if args.quick else [])
            subprocess.run(cmd, check=True)
        for file in files:
            src = folder / file if (folder / file).exists() else source / file
            if not src.exists():
                print(f"skipped {file}: not in {folder}")
                continue
            dst = target / file
            (small_gif if src.suffix == ".gif" else small_png)(src, dst)
            print(f"{dst}: {dst.stat().st_size / 1e3:.0f} kB (from {src})")


if __name__ == "__main__":
    main()
