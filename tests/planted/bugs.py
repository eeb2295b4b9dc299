"""Bugs planted on purpose, each a change of a few lines, and the tests that must catch it.

`make test-planted` (run.py) applies each to a scratch copy of the tree and runs its tests
there: a bug the tests let through is a hole in the suite. A change is one or more exact
replacements (file, old text, new text); one that no longer finds its old text fails the run
(the code moved: the bug must be planted anew, not skipped).
"""
from __future__ import annotations

from dataclasses import dataclass

COMMIT_SUITE = "tests/fastckpt/commit/test_commit_protocol.py"  # the commit seam's power-loss cases


@dataclass(frozen=True)
class Bug:
    name: str
    what: str
    edits: tuple  # (path, old, new), each old found exactly once
    tests: tuple  # pytest arguments that must fail with the bug planted (and pass without it)


BUGS = (
    Bug("data-fdatasync-after-record",
        "the data file's fdatasync moved from the writer's finish to after the commit record and latest",
        (("native/src/file_sink.cc", "  fdatasync_or_throw(fd_, path_);\n  close();", "  close();"),
         ("fastckpt/commit/checkpoint_unit.py",
          "                self.store.commit(info)\n",
          "                self.store.commit(info)\n"
          "                fd = os.open(self.file_path, os.O_RDONLY)  # planted: durable only now\n"
          "                os.fdatasync(fd)\n"
          "                os.close(fd)\n")),
        (COMMIT_SUITE, "-k", "every_disk and CheckpointCommit")),
    Bug("record-before-directory-fsync",
        "the commit record written before the names of its files and folder are durable",
        (("fastckpt/commit/record.py",
          "        fsync_dir(info.path)\n        fsync_dir(os.path.dirname(os.path.abspath(info.path)))\n", ""),),
        (COMMIT_SUITE, "-k", "every_disk and (CheckpointCommit or GatheredCommit)")),
    Bug("latest-before-record",
        "the root store moves `latest` before writing the COMMIT record",
        (("fastckpt/store/root_store.py", "        commit.write(info)\n        self.move_latest(info)",
          "        self.move_latest(info)\n        commit.write(info)"),),
        (COMMIT_SUITE, "-k", "every_disk and CheckpointCommit")),
    Bug("rank0-commits-on-its-own-result",
        "rank 0 writes the record after checking only its own part, not every rank's",
        (("fastckpt/commit/ordered.py", "            if not all(ok for ok, _ in everyone):",
          "            if not everyone[self._agree.rank][0]:"),
         ("fastckpt/commit/ordered.py", "                info = unit.record([p for _, p in everyone], self._agree.rank)",
          "                info = unit.record([p for ok, p in everyone if ok], self._agree.rank)")),
        ("tests/fastckpt/test_distributed.py", "-k", "stays_alive")),
    Bug("fastckpt-latest-at-submit",
        "DeepSpeed's fastckpt-latest names a tag when it is submitted, before its record exists",
        (("deepspeed_fastckpt/tags.py", "        folder = os.path.join(save_dir, str(tag))\n",
          "        folder = os.path.join(save_dir, str(tag))\n        write_latest(save_dir, str(tag))  # planted\n"),),
        ("tests/deepspeed_fastckpt/test_deepspeed_load.py", "-k", "fastckpt_latest_names")),
    Bug("offload-zeros-over-1mib",
        "activation offload's unpack hands back zeros for tensors over 1 MiB",
        (("fastckpt/offload/activations.py",
          "        if done:\n            self.close()\n        return t\n",
          "        if done:\n            self.close()\n"
          "        return torch.zeros_like(t) if packed.nbytes > (1 << 20) else t  # planted\n"),),
        ("tests/fastckpt/offload/test_offload_activations.py", "-k", "several_mib")),
    Bug("torch-save-record-crc-off",
        "a record's CRC-32 is not checked (the whole-file CRC still is, and torch.save's files have none)",
        (("fastckpt/format/torch_format.py", "        if c != e.crc:", "        if False and c != e.crc:  # planted"),),
        ("tests/fastckpt/test_hostile.py", "-k", "torch_save")),
    Bug("crc-check-off",
        "no CRC-32 is checked on load or verify",
        (("fastckpt/format/torch_format.py",
          "def check_crcs(path: str, idx: ZipIndex, order, crcs, at: int | None = None) -> None:\n",
          "def check_crcs(path: str, idx: ZipIndex, order, crcs, at: int | None = None) -> None:\n"
          "    return  # planted\n"),),
        ("tests/fastckpt/tools/test_verify_cli.py", "-k", "flipped")),
    Bug("tier-check-opens-the-part",
        "the check before a memory-tier part's copy to the disk reads its index through a descriptor of "
        "the part (a process forked meanwhile inherits it), not in the mapping its save left held",
        (("fastckpt/verify.py", "        idx = read_index(path, at=at)\n", "        idx = read_index(path)  # planted\n"),),
        ("tests/fastckpt/tiers/test_tiers.py", "-k", "never_opens_it")),
    Bug("retention-deletes-the-newest",
        "retention removes the newest checkpoints instead of the oldest",
        (("fastckpt/store/root_store.py", "        for info in committed[max(1, keep):] if keep > 0 else []:",
          "        for info in committed[:max(1, keep)] if keep > 0 else []:"),),
        ("tests/fastckpt/test_checkpointer.py", "-k", "in_order_and_keep")),
    Bug("gate-returns-at-once",
        "gate() returns without waiting for the snapshot's copy",
        (("fastckpt/checkpointer.py", "        stalled = self._inflight.wait_copied(timeout, self._gate_waited)\n",
          "        return  # planted\n        stalled = self._inflight.wait_copied(timeout, self._gate_waited)\n"),),
        # the first catches it only while the copy is still running when gate() returns; the
        # second holds the copy until it has seen the gate wait
        ("tests/fastckpt/test_checkpointer.py", "tests/fastckpt/write/test_write_checkpointer.py", "-k",
         "gate_means_snapshot or held_stream")),
    Bug("unpickler-takes-any-global",
        "the restricted unpickler resolves any global a file names",
        (("fastckpt/format/safe_unpickler.py", "def _allowed_global(module: str, name: str) -> Any:\n",
          "def _allowed_global(module: str, name: str) -> Any:\n"
          "    import importlib  # planted\n"
          "    return getattr(importlib.import_module(module), name)\n"),),
        ("tests/fastckpt/test_hostile.py", "-k", "pickle_payload")),
    Bug("dcp-metadata-unchecked",
        "the DCP reader takes `.metadata` without checking it against the commit record",
        (("fastckpt/dcp/reader.py", "            if entry is None or entry.bytes != len(raw) or entry.crc32 != zlib.crc32(raw):",
          "            if False:  # planted"),),
        ("tests/fastckpt/dcp/test_dcp_storage.py", "-k", "replaced_metadata")),
    Bug("dcp-stager-slot-reuse",
        "FastStager reuses a snapshot's slot while its save still reads it",
        (("fastckpt/dcp/slots.py", "        return self.alive == 0 or ended", "        return True  # planted"),),
        ("tests/fastckpt/dcp/test_stager.py", "-k", "each_checkpoint_is_its_step")),
    Bug("save-waits-for-the-copy",
        "save() of a stream-read snapshot waits for its copies before returning",
        (("fastckpt/checkpointer.py", "        pending.write, pending.plan, pending.watch = write, plan, watch\n",
          "        pending.write, pending.plan, pending.watch = write, plan, watch\n"
          "        if write is not None:\n            write.wait_copied()  # planted\n"),),
        ("tests/fastckpt/write/test_write_checkpointer.py", "-k", "held_stream")),
    Bug("gate-waits-for-the-file",
        "the gate over a stream-read 'c' snapshot waits until its file is written, not only copied",
        (("fastckpt/write/device_file.py", '        self._hold_gate = strategy == "d"',
          "        self._hold_gate = True  # planted"),),
        ("tests/fastckpt/write/test_write_checkpointer.py", "-k", "held_stream")),
    Bug("crc-summed-before-put",
        "a staged chunk's CRC is summed on its writer before the put: the disk waits for every CRC",
        (("native/src/write_job.cc",
          "      const uint64_t at = chunk_begin(c) + lo;\n      {\n        PhaseTimer t(timings_.put);\n"
          "        sink_->put(buf, len, at, true);",
          "      const uint64_t at = chunk_begin(c) + lo;\n      const uint64_t base = chunk_begin(c);\n"
          "      for (size_t s = chunk_first_span_[c]; s < chunk_first_span_[c + 1]; ++s)  // planted\n"
          "        span_crc_[s] = crc32_update(0, w_.pool->data(slot) + (spans_[s].file_off - base), spans_[s].len);\n"
          "      {\n        PhaseTimer t(timings_.put);\n"
          "        sink_->put(buf, len, at, true);"),),
        ("tests/native/test_native_core.py",)),
    Bug("chunk-slot-freed-at-put",
        "a staging chunk's slot is freed when its put ends, while its CRC may still be summing it",
        (("native/src/write_job.cc", "  chunk_half_done(c, slot);\n}\n\n// The CRC of every span",
          "  w_.pool->release(slot);  // planted\n  chunk_half_done(c, slot);\n}\n\n// The CRC of every span"),
         ("native/src/write_job.cc", "  w_.pool->release(slot);\n  count_written();", "  count_written();")),
        ("tests/native/test_native_core.py",)),
    Bug("writers-niced",
        "the writers run at the CRC threads' lower priority: a busy CPU wakes them late and the disk idles",
        (("native/src/engine.cc", 'writers_(write_threads, 0, "fastckpt-write")',
          'writers_(write_threads, kBackgroundNice, "fastckpt-write")  /* planted */'),),
        ("tests/fastckpt/write/test_thread_priority.py",)),
    Bug("cpu-copy-put-on-writers",
        "a staged chunk's put that is a CPU copy (through the page cache) runs on the writers, off the lower priority",
        (("native/src/write_job.cc", "(sink_->put_is_cpu_copy() ? w_.summers : w_.writers)",
          "(false /* planted */ ? w_.summers : w_.writers)"),),
        ("tests/native/test_native_core.py",)),
    Bug("io-memory-not-advised",
        "staging is left to 4 KiB pages (no huge-page advice): O_DIRECT requests from it stay small",
        (("native/src/io_memory.cc", "  if (huge) ::madvise(start, size_, MADV_HUGEPAGE);",
          "  if (false) ::madvise(start, size_, MADV_HUGEPAGE);  // planted"),),
        ("tests/native/test_native_core.py",)),
    Bug("chunk-put-whole",
        "a staged chunk is always put whole: the disk waits for a chunk's whole copy at the start of a checkpoint",
        (("native/src/write_job.cc", "  return std::max<uint64_t>(kAlign, chunk_bytes_ / kSlicesPerChunk",
          "  return chunk_bytes_;  // planted\n  return std::max<uint64_t>(kAlign, chunk_bytes_ / kSlicesPerChunk"),),
        ("tests/native/test_native_core.py",)),
    Bug("slices-ignore-backlog",
        "every staged chunk is put in slices, even while the writers have chunks' worth waiting",
        (("native/src/write_job.cc", " || put_backlog_.load() >= chunk_bytes_) return", ") return"),),
        ("tests/native/test_native_core.py",)),
    Bug("pool-grows-under-lock",
        "the staging pool faults a new chunk in while holding its lock: writes wait for the growth",
        (("native/src/staging_pool.cc",
          "    IoMemory chunk(chunk_bytes_);  // zeroed and present: no fault in the first snapshot\n"
          "    out.push_back(reinterpret_cast<uintptr_t>(chunk.data()));\n"
          "    {\n"
          "      std::lock_guard<std::mutex> lk(mu_);\n",
          "    std::lock_guard<std::mutex> lk(mu_);  // planted\n"
          "    IoMemory chunk(chunk_bytes_);\n"
          "    out.push_back(reinterpret_cast<uintptr_t>(chunk.data()));\n"
          "    {\n"),),
        ("tests/native/test_native_core.py",)),
    Bug("headers-built-before-crcs",
        "a native job's file gets its headers built without waiting for every CRC to be summed",
        (("fastckpt/write/job_write.py", "    wait(job.wait_summed, \"the CRCs\")\n", ""),),
        ("tests/fastckpt/test_roundtrip.py",)),
    Bug("ahead-file-not-taken",
        "the root store's begin() leaves the file made ahead where it is: every save creates its own",
        (("fastckpt/store/root_store.py",
          "        if ahead.take(self.root, name, part):\n            self._taken.add(part)\n", ""),),
        ("tests/fastckpt/store/test_ahead.py",)),
    Bug("ahead-file-recycles-old-checkpoint",
        "retention keeps a removed checkpoint's file as the next file made ahead (written over in place)",
        (("fastckpt/store/root_store.py",
          "        shutil.rmtree(path, ignore_errors=True)\n        try:\n            fsync_dir(self.root)",
          "        try:  # planted\n"
          "            os.makedirs(os.path.join(self.root, ahead.FOLDER), exist_ok=True)\n"
          "            os.replace(os.path.join(path, 'rank-0.pt'), ahead.path_of(self.root, 'rank-0.pt'))\n"
          "        except OSError:\n"
          "            pass\n"
          "        shutil.rmtree(path, ignore_errors=True)\n        try:\n            fsync_dir(self.root)"),),
        ("tests/fastckpt/store/test_ahead.py",)),
    Bug("ahead-moves-not-durable",
        "the record of a checkpoint whose file was made ahead is written before that file's moves are durable",
        (("fastckpt/store/root_store.py", "            ahead.durable_moves(self.root)\n", ""),),
        (COMMIT_SUITE, "-k", "every_disk and CheckpointCommit")),
    Bug("ahead-left-from-a-crash-kept",
        "a writer starting after a crash keeps what was left half made ahead",
        (("fastckpt/store/root_store.py", "        ahead.clear(self.root)\n        for _, _, path in self._dirs():",
          "        for _, _, path in self._dirs():"),),
        ("tests/fastckpt/store/test_ahead.py",)),
    Bug("stager-slot-judged-while-its-thread-returns",
        "FastStager counts a slot in flight while its own thread, having delivered the snapshot, has not yet returned",
        (("fastckpt/dcp/stager.py", "        self._let_go()\n        slot = self._slots.take(",
          "        slot = self._slots.take("),),
        ("tests/fastckpt/dcp/test_stager.py", "-k", "let_go_of_frees_its_slot")),
    Bug("tier-keep-length-unchecked",
        "tier_keep's length is not checked against tiers: a short list is an IndexError on a commit thread "
        "after the first persist, a long one keeps another tier's count",
        (("fastckpt/settings.py", '        self._check_per_tier(len(tiers), f"each of the {len(tiers)} tiers")\n', ""),),
        ("tests/fastckpt/tiers/test_tiers.py", "-k", "per_tier")),
    Bug("replica-unchecked-in-place",
        "a replica received straight into the partner's memory (a tmpfs tier's mapping) is not CRC-checked on "
        "arrival: one damaged in transit is kept as the replica",
        (("fastckpt/store/replicas.py",
          "                verify_file(path, entry, at=at)  # the CRCs over the bytes as received\n",
          "                if not (in_place and entry.bytes):  # planted\n"
          "                    verify_file(path, entry, at=at)\n"),),
        ("tests/fastckpt/tiers/test_tier_ranks.py", "-k", "damaged_in_transit")),
    Bug("memory-bound-forgets-replicas",
        "the memory tier's room check counts each rank's own part only, not its wards' replicas: with replicas=1 "
        "the tier holds twice what it was sized for",
        (("fastckpt/store/tiered_store.py",
          "        kept = 1 + (len(self._replicas.wards) if self._replicas is not None else 0)",
          "        kept = 1  # planted"),),
        ("tests/fastckpt/tiers/test_tier_ranks.py", "-k", "memory_bound")),
    Bug("tier-retention-on-rank-0-only",
        "retention of the memory tier runs on rank 0 alone: every other rank's memory-tier folder grows without bound",
        (("fastckpt/store/tiered_store.py", "        if self.rank == 0 or tier is not self.tiers[-1]:",
          "        if self.rank == 0:  # planted"),),
        ("tests/fastckpt/tiers/test_tier_ranks.py", "-k", "tier_keep_on_its_memory_tier")),
    Bug("tier-copy-buffered-no-fdatasync",
        "the copy of a part behind the memory tier through the page cache (a filesystem refusing O_DIRECT; "
        "replicas always) is never fdatasync'ed: recorded as persisted while its bytes are only in the page cache",
        (("fastckpt/store/tier_copy.py", "    try:\n        os.fdatasync(fd)\n", "    try:\n        pass  # planted\n"),),
        ("tests/crashsim/test_power_loss.py", "-k", "over_the_tiers and tiers_buffered")),
    Bug("tier-copy-direct-no-fdatasync",
        "the O_DIRECT copy of a part behind the memory tier (and of a named path's memory copy) is not fdatasync'ed: "
        "its size and the blocks' allocation are not durable when the record is written",
        (("native/src/tensor_io.cc",
          'throw_io("ftruncate", path, off + n, errno);\n  if (sync) fdatasync_or_throw(fd.get(), path);',
          'throw_io("ftruncate", path, off + n, errno);\n  (void)sync;  // planted'),),
        ("tests/crashsim/test_power_loss.py", "-k", "over_the_tiers and path_tiers")),
    Bug("replica-not-fdatasynced",
        "a replica received into a buffer (a memory tier on a disk) is written through the page cache and never "
        "fdatasync'ed before the record that counts it",
        (("fastckpt/store/replicas.py", "                    write_durably(path, at, buf.numel(), direct_io=False)\n",
          "                    _native.write_buffered(path, 0, at, buf.numel(), False)  # planted\n"),),
        ("tests/crashsim/test_power_loss.py", "-k", "over_the_tiers and replicas")),
    Bug("named-path-rename-half-durable",
        "the rename of a named path's persisted copy over the path is made durable in the path's folder only, not "
        "in the hidden folder it came from: a power loss can undo it after the save was reported persisted",
        (("fastckpt/store/path_tier.py", "        fsync_dir(folder)\n        fsync_dir(os.path.dirname(self.target))",
          "        fsync_dir(os.path.dirname(self.target))  # planted"),),
        ("tests/crashsim/test_power_loss.py", "-k", "over_the_tiers and path_tiers")),
    Bug("spare-moves-not-durable",
        "retention on a disk-backed node tier moves a removed part's file aside (to be written over) without making "
        "the move durable: a later part renamed out of the spares can vanish in a power loss under its record",
        (("fastckpt/store/node_tier.py", "                fsync_dir(path)  # later save renames a spare into its folder (recycle_into)\n"
                                         "                fsync_dir(spare_dir)\n",
          "                pass  # planted\n"),),
        ("tests/crashsim/test_power_loss.py", "-k", "over_the_tiers and replicas")),
    Bug("recycled-part-rename-not-durable",
        "a spare file renamed into a new part's folder on a disk-backed node tier is not made durable on the spares' "
        "side: the record can name a part a power loss leaves in the spares",
        (("fastckpt/store/node_tier.py", "            if self.sink_kind == \"file\":\n                fsync_dir(os.path.dirname(spare))",
          "            pass  # planted"),),
        ("tests/crashsim/test_power_loss.py", "-k", "over_the_tiers and replicas")),
    Bug("deepspeed-error-on-one-rank",
        "a failed DeepSpeed tag is raised at the next save only on the ranks whose commit thread already recorded "
        "it: the others go on into DeepSpeed's tag check and wait there for the process group's timeout",
        (("deepspeed_fastckpt/engine.py", "        self.committer.raise_agreed()\n",
          "        self.committer.raise_errors()  # planted\n"),),
        ("tests/deepspeed_fastckpt/test_deepspeed_export.py", "-k", "same_save")),
    Bug("16bit-export-as-a-tag",
        "a file DeepSpeed saves outside its tag folder (save_16bit_model's) is committed as a file of the tag: the "
        "export is reported failed on every rank",
        (("deepspeed_fastckpt/engine.py",
          "        in_tag = [(path, pending) for path, pending in files if os.path.dirname(path) == tag_dir]\n",
          "        in_tag = files  # planted\n"),),
        ("tests/deepspeed_fastckpt/test_deepspeed_export.py", "-k", "16bit")),
    Bug("tag-marked-at-create",
        "the tag's open mark is left when DeepSpeed opens a save, whether or not it writes a file into the tag: "
        "save_16bit_model leaves a stray global_stepN/fastckpt-tag.open",
        (("deepspeed_fastckpt/engine.py", "        self._tag_dir, self._marked = tag_folder(info), False\n",
          "        self._tag_dir, self._marked = tag_folder(info), True  # planted\n"
          "        mark_open(info.save_dir, info.tag)\n"),),
        ("tests/deepspeed_fastckpt/test_deepspeed_export.py", "-k", "16bit")),
    Bug("named-tier-leftovers-kept",
        "a save through a memory tier in front of named paths never sweeps what a copy to a path cut short by a kill "
        "left there: hidden .NAME.fastckpt-PID-N.tmp folders pile up beside the checkpoints",
        (("fastckpt/store/named_tiers.py",
          "        sweep_dead_tmp(os.path.dirname(target))  # what a copy to a path cut short by a kill left there\n", ""),),
        ("tests/fastckpt/tiers/test_named_tiers_campaign.py",)),
    Bug("file-set-persist-error-ignored",
        "a set's file whose copy from the memory tier to its path failed (disk full) still gets its set committed: "
        "a DeepSpeed tag gets its COMMIT and its fastckpt-latest while its file is not on disk",
        (("fastckpt/commit/file_sets.py", "                pending.raise_placed()\n", ""),),
        ("tests/deepspeed_fastckpt/test_deepspeed_export.py", "-k", "same_save and persist")),
    Bug("dcp-persist-error-ignored",
        "a DCP rank file whose copy from the memory tier failed counts as written: the checkpoint is committed "
        "without it on disk",
        (("fastckpt/dcp/writer.py", "            pending.raise_placed()\n", ""),),
        ("tests/fastckpt/tiers/test_persist_errors.py", "-k", "dcp")),
    Bug("persist-error-raised-twice",
        "a failed copy behind the memory tier that its caller already raised (a DeepSpeed tag, a DCP checkpoint) is "
        "raised again by the owner at the next call",
        (("fastckpt/commit/persisting.py", "            self._copied(unit, infos, error, seen=lambda: pending.placed_observed)",
          "            self._copied(unit, infos, error)  # planted"),),
        ("tests/deepspeed_fastckpt/test_deepspeed_export.py", "-k", "same_save and persist")),
    Bug("preempt-last-not-linked",
        "Lightning's `last` is left as it was after a SIGTERM checkpoint: fit(ckpt_path=\"last\") resumes from the "
        "older last.ckpt and the steps since are lost",
        (("lightning_fastckpt/preempt.py", "            if trainer.is_global_zero:\n                point_last_at(trainer, path)\n",
          ""),),
        ("tests/lightning_fastckpt/test_lightning_preempt.py", "-k", "resume_from_last")),
    Bug("checkpointer-error-on-one-rank",
        "a failed checkpoint is raised at the next save only on the ranks whose commit thread already recorded it: "
        "the others issue the next save and their commit waits for a rank that is gone",
        (("fastckpt/checkpointer.py", "        self._raise_background_errors(agreed=True)",
          "        self._raise_background_errors(agreed=False)  # planted"),),
        ("tests/fastckpt/test_agreed_errors.py", "-k", "checkpointer")),
    Bug("lightning-error-on-rank-0-only",
        "under DDP a failed save is raised on rank 0 alone, inside Trainer.save_checkpoint, while the other ranks "
        "wait in its barrier",
        (("lightning_fastckpt/watch.py",
          "            io.agree_on_errors(lambda raising: strategy.reduce_boolean_decision(raising, all=False))\n",
          "            pass  # planted\n"),),
        ("tests/lightning_fastckpt/test_lightning_ddp.py", "-k", "failed_on_rank_0")),
    Bug("ls-lists-temporaries-as-checkpoints",
        "a file of a save in flight is listed among the checkpoints of a Lightning folder, under its target's name",
        (("fastckpt/tools/folders.py",
          '        entries = [_listed_entry(row) for row in rows if row.status != "temporary"]\n',
          '        entries = [_listed_entry(row) for row in rows]\n'),),
        ("tests/fastckpt/tools/test_first_day.py", "-k", "ls_after_a_kill")),
    Bug("deepspeed-imported-for-every-folder",
        "the DeepSpeed plugin's package imports its engine (and so DeepSpeed) at once: `fastckpt ls` of any folder "
        "imports DeepSpeed and prints its accelerator warnings",
        (("deepspeed_fastckpt/__init__.py", "from .on_import import after_import\n",
          "from .on_import import after_import\nfrom .engine import FastckptEngine  # noqa: F401  planted\n"),),
        ("tests/fastckpt/tools/test_first_day.py", "-k", "import_no_framework")),
    Bug("safetensors-export-with-pads",
        "an export to safetensors keeps the checkpoint format's pad entries",
        (("fastckpt/format/safetensors_format.py", "    return _layout(entries, skel, pad=not plain)",
          "    return _layout(entries, skel)"),),
        ("tests/fastckpt/tools/test_first_day.py", "-k", "safetensors_export")),
    Bug("stock-dcp-warned-twice",
        "a checkpoint of DCP's own writer is warned about by newest_committed and again by FastStorageReader",
        (("fastckpt/dcp/stock_warning.py", "    if key not in _said:\n", "    if True:  # planted\n"),),
        ("tests/fastckpt/dcp/test_resumable.py", "-k", "warns_once")),
    Bug("watch-added-to-every-trainer",
        "Lightning's entry point adds FastckptWatch to every Trainer, whether it uses fastckpt or not",
        (("lightning_fastckpt/__init__.py", "    if not (len(MADE) or front_ends.is_started(\"deepspeed\")):\n",
          "    if False:  # planted\n"),),
        ("tests/project/test_no_patched_classes.py", "-k", "watch")),
    Bug("newest-committed-str-is-its-name",
        "newest_committed's str is the checkpoint's folder name, not its path: json.dumps of it, or a path made "
        "from it, points nowhere",
        (("fastckpt/dcp/committed.py", "        self = super().__new__(cls, os.fspath(path))\n",
          "        self = super().__new__(cls, os.path.basename(os.fspath(path)))  # planted\n"),),
        ("tests/fastckpt/dcp/test_resumable.py", "-k", "a_str")),
    Bug("url-root-taken-for-a-local-folder",
        "a URL of no store given as the Checkpointer's root is taken for a local path: Checkpointer('gs://ckpt/run') "
        "writes a local folder 'gs:' and the bucket stays empty",
        (("fastckpt/settings.py", '            local_place(self.root, "the root")\n', "            pass  # planted\n"),),
        ("tests/fastckpt/test_urls_refused.py", "-k", "root")),
    Bug("s3-upload-after-record",
        "the S3 store uploads a rank's part only after rank 0 PUT the record: a crash between them leaves a "
        "record naming objects that are not there",
        (("fastckpt/store/s3/s3_store.py",
          "        result = write.finish()\n        key = self._begun[part]\n        try:\n",
          "        result = write.finish()\n        key = self._begun[part]\n        self._late = (key, part)\n"
          "        return result  # planted\n        try:\n"),
         ("fastckpt/store/s3/s3_store.py",
          "        self.move_latest(info)\n\n    def move_latest",
          "        self.move_latest(info)\n        self.bucket.put_file(*self._late, self.part_bytes, 8)  # planted\n\n"
          "    def move_latest"),
         ("fastckpt/store/s3/s3_store.py", "        return self.where.url_of(self._begun.pop(part))",
          "        return self.where.url_of(self._begun[part])  # planted")),
        ("tests/fastckpt/s3/test_s3_store.py", "-k", "two_ranks or campaign")),
    Bug("s3-record-written-over",
        "the S3 store's record PUT is unconditional: a second writer's record replaces a committed one",
        (("fastckpt/store/s3/s3_store.py", "self.bucket.put_bytes(key, raw, create_once=True)",
          "self.bucket.put_bytes(key, raw, create_once=False)"),),
        ("tests/fastckpt/s3/test_s3_store.py", "-k", "written_once")),
    Bug("s3-etag-unchecked",
        "the S3 store's listing checks its objects' sizes but not their ETags against the record",
        (("fastckpt/store/s3/s3_store.py", "            if f.etag and etag and f.etag != etag:",
          "            if False:  # planted"),),
        ("tests/fastckpt/s3/test_s3_store.py", "-k", "written_over")),
    Bug("s3-killed-uploads-never-aborted",
        "unfinished multipart uploads a killed writer left are never aborted (by the next writer's start nor by "
        "retention): their parts stay billed",
        (("fastckpt/store/s3/s3_store.py",
          "        for upload in self.bucket.uploads(self.where.key(\"\")):\n            self.bucket.abort_upload(upload)\n",
          "        pass  # planted\n"),
         ("fastckpt/store/s3/s3_store.py", "        aborted = []\n",
          "        aborted = []\n        return aborted  # planted\n")),
        ("tests/fastckpt/s3/test_s3_store.py", "-k", "campaign")),
    Bug("dcp-s3-files-never-uploaded",
        "FastStorageWriter to s3:// commits a record naming rank files it never uploaded",
        (("fastckpt/dcp/writer.py", "                etag = remote.upload(path, self.config.chunk_mb << 20)\n",
          "                etag = \"\"  # planted\n"),),
        ("tests/fastckpt/s3/test_s3_dcp.py", "-k", "resharded")),
)
