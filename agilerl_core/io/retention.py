"""Retention: what of a run's committed generations is kept.

The member checkpoints of the last K generations, the elite of every generation, and the shards that still
reach into the replay buffer (it is rebuilt from the newest shards: exactly the last ``capacity`` committed
transitions). A pruned generation's manifest is rewritten first, then its dropped files deleted, so a manifest
never lists a file that is gone.
"""

from __future__ import annotations


class Retention:
    """The retention of :class:`agilerl_core.io.run_store.RunStore` (a mixin: it reads and rewrites manifests
    through the store's :class:`agilerl_core.io.manifest.Manifests` methods and remembers, in the store's
    `_settled`, the generations pruned for good)."""

    def prune(self, keep: int) -> list[int]:
        """Keep the member checkpoints of the last `keep` generations and every generation's elite, and the
        shards that still reach into the buffer; delete the rest. Returns the generations pruned now."""
        gens = self.committed_generations()
        if not gens:
            return []
        latest = gens[-1]
        window = {g for g, _ in self.buffer_window(latest)}
        pruned = []
        for g in gens:
            if g > latest - keep or g in self._settled:
                continue
            manifest = self.manifest(g)
            shards_needed = bool(window) and g >= min(window)
            if manifest.get("pruned") and (shards_needed or not manifest["shards"]):
                if not manifest["shards"]:
                    self._settled.add(g)
                continue
            elite = self.key(self.gen_dir(g), "population", "members", str(manifest["elite_slot"])) + "/"
            pop_json = self.key(self.gen_dir(g), "population", "population.json")
            drop = [k for k in manifest["files"] if not k.startswith(elite) and k != pop_json]
            kept = {k: v for k, v in manifest["files"].items() if k not in drop}
            drop_shards = [] if shards_needed else [s["key"] for s in manifest["shards"]]
            new = {**manifest, "files": kept, "pruned": True,
                   "shards": manifest["shards"] if shards_needed else []}
            self._put_manifest(g, new)  # the manifest first: it never lists a
            self.storage.delete(drop + drop_shards)                  # file that is gone
            if not new["shards"]:
                self._settled.add(g)
            pruned.append(g)
        return pruned
