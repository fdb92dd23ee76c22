"""``mla-var3 autotune``: show or clear the autotune cache."""

from __future__ import annotations


def run(args) -> int:
    from mla_var3.runtime.autotune import AutotuneCache

    cache = AutotuneCache()
    if args.clear:
        print(f"{'removed' if cache.clear() else 'no cache at'} {cache.path}")
        return 0
    entries = cache.entries()
    print(f"{cache.path}: {len(entries)} tuned configs")
    for key, entry in sorted(entries.items()):
        t = entry.get("time_us")
        print(f"  {key}: {entry['config']}" + (f" ({t:,.1f} µs)" if isinstance(t, (int, float)) else ""))
    return 0


def add(sub) -> None:
    p = sub.add_parser("autotune", help="show or clear the autotune cache",
                       description="The autotune cache (autotune.json in $MLA_VAR3_CACHE_DIR, else the user cache "
                                   "folder): list its entries, or --clear it.")
    p.add_argument("--clear", action="store_true", help="delete the cache file")
    p.set_defaults(func=run)
