"""MovieLens-100k as daily partitions for the streaming trainer.

    python scripts/movielens_partitions.py --out ROOT [--source DIR] [--download DIR]

Reads recbole's copy of MovieLens-100k (`ml-100k.inter`, `.user`, `.item`, from the
recbole 1.2.1 wheel: `pip download --no-deps recbole==1.2.1 -d DIR`, then the files
under recbole/dataset_example/ml-100k/; --download DIR does both) and writes one
partition per UTC day, ROOT/yyyyMMdd/part-00000 plus _SUCCESS, rows in time order:

    label  user  item  age  gender  occupation  zip3  year  genre1  genre2  genre3  timestamp

label = 1 where rating >= 4; the user and item attributes are categorical strings
(empty where missing). The matching schema spec is SCHEMA below (tab-separated, no
header). The data's licence forbids redistribution: write it outside the repository.
"""

import argparse
import collections
import os
import subprocess
import sys
import time
import zipfile

SCHEMA = ("label:label,user:categorical,item:categorical,age:categorical,gender:categorical,"
          "occupation:categorical,zip3:categorical,year:categorical,genre1:categorical,"
          "genre2:categorical,genre3:categorical,timestamp:timestamp")
_WHEEL = "recbole-1.2.1-py3-none-any.whl"
_MEMBER = "recbole/dataset_example/ml-100k/"


def _read(path):
    with open(path, encoding="latin-1") as f:
        header = f.readline().rstrip("\n").split("\t")
        names = [h.split(":")[0] for h in header]
        return [dict(zip(names, line.rstrip("\n").split("\t"))) for line in f if line.strip()]


def download(directory: str) -> str:
    """Fetches the recbole wheel with pip and unpacks ml-100k; returns its folder."""
    os.makedirs(directory, exist_ok=True)
    wheel = os.path.join(directory, _WHEEL)
    if not os.path.exists(wheel):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "recbole==1.2.1",
                        "-d", directory, "-q"], check=True)
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.startswith(_MEMBER) and member.endswith((".inter", ".user", ".item")):
                archive.extract(member, directory)
    return os.path.join(directory, _MEMBER)


def write_partitions(source: str, out: str, max_days=None) -> dict:
    """Writes the daily partitions; returns {"days", "rows", "positives"}."""
    for name in ("ml-100k.inter", "ml-100k.user", "ml-100k.item"):
        if not os.path.isfile(os.path.join(source, name)):
            raise FileNotFoundError(f"{os.path.join(source, name)} not found (see --download)")
    users = {u["user_id"]: u for u in _read(os.path.join(source, "ml-100k.user"))}
    items = {i["item_id"]: i for i in _read(os.path.join(source, "ml-100k.item"))}
    ratings = sorted(_read(os.path.join(source, "ml-100k.inter")),
                     key=lambda r: (int(float(r["timestamp"])), r["user_id"], r["item_id"]))
    days = collections.defaultdict(list)
    for r in ratings:
        stamp = int(float(r["timestamp"]))
        user = users.get(r["user_id"], {})
        item = items.get(r["item_id"], {})
        genres = (item.get("class", "").split() + ["", "", ""])[:3]
        row = ["1" if float(r["rating"]) >= 4 else "0", r["user_id"], r["item_id"],
               user.get("age", ""), user.get("gender", ""), user.get("occupation", ""),
               user.get("zip_code", "")[:3], item.get("release_year", ""), *genres, str(stamp)]
        days[time.strftime("%Y%m%d", time.gmtime(stamp))].append("\t".join(row))
    names = sorted(days)[:max_days]
    positives = 0
    for day in names:
        folder = os.path.join(out, day)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "part-00000"), "w") as f:
            f.write("\n".join(days[day]) + "\n")
        open(os.path.join(folder, "_SUCCESS"), "w").close()
        positives += sum(line.startswith("1\t") for line in days[day])
    return {"days": len(names), "rows": sum(len(days[d]) for d in names),
            "positives": positives}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="data root to write partitions into")
    parser.add_argument("--source", default=None,
                        help="folder with ml-100k.inter/.user/.item (from the recbole wheel)")
    parser.add_argument("--download", default=None,
                        help="fetch the recbole 1.2.1 wheel into this folder with pip and "
                             "unpack ml-100k there (instead of --source)")
    parser.add_argument("--max_days", type=int, default=None,
                        help="write only the first N days")
    args = parser.parse_args(argv)
    if (args.source is None) == (args.download is None):
        parser.error("give exactly one of --source or --download")
    if args.source is not None and not os.path.isdir(args.source):
        parser.error(f"--source {args.source!r} is not a folder")
    source = args.source or download(args.download)
    print(write_partitions(source, args.out, args.max_days))
    print(f"schema: {SCHEMA}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
