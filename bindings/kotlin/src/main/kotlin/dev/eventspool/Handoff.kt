package dev.eventspool

import java.time.Instant
import java.util.concurrent.CompletableFuture
import java.util.concurrent.ConcurrentLinkedQueue
import java.util.concurrent.Semaphore
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicBoolean
import java.util.concurrent.atomic.AtomicLong
import java.util.concurrent.locks.LockSupport
import kotlinx.serialization.json.JsonObject
import kotlinx.serialization.json.JsonPrimitive
import uniffi.eventspool.EventSpool
import uniffi.eventspool.Priority

/**
 * The bounded hand-off between `track()` and the core, and the one thread that talks to it.
 *
 * Why: one call through the generated bindings costs tens of microseconds of JNA marshalling,
 * too much for a UI thread, and opening the store (loading the library, SQLite, a migration)
 * costs milliseconds to seconds. `track()` only puts a small record here (the id and timestamp
 * are fixed already, so they never change later); the thread first opens the spool, then takes
 * everything waiting and records it with one `track_batch_report` call: the FFI cost is paid
 * once per batch, and under `durability = always` (the layer's default) the batch is one commit
 * (group commit) on this thread, never on the caller's.
 *
 * Bounded: at most [capacity] events wait here, also while the spool is still opening (the
 * pre-open queue). When it is full, `track()` does not wait unless [mayWait] says this thread
 * may (never a UI thread): the event is counted as `handoff_full`. Control items (setEnabled,
 * flush, a wait for the hand-off) are not counted against the bound, so they are never refused,
 * and they run in order with the events around them.
 *
 * Waking a sleeping thread is a system call on the caller's thread, and every batch is one FFI
 * call (and, under `always`, one commit). So the thread lingers [LINGER_NS] after each batch
 * while the calls of an app's pace gather, and `track()` wakes it only when it sleeps with
 * nothing to do, or when a batch's worth is waiting. A control item ends a linger at once.
 * Idle, the thread sleeps: no timer wakes it.
 *
 * What a crash can lose: the events waiting here and those inside the `track_batch_report` call
 * in progress. At an app's rate that is the events of the last call (a few milliseconds, the
 * time of one commit); a burst that fills the queue loses up to [capacity].
 */
internal class Handoff(
    val capacity: Int,
    private val maxBatch: Int,
    private val open: () -> EventSpool?,
    private val mayWait: () -> Boolean,
    private val onRejected: (HandoffRejected) -> Unit,
    private val refused: Refusals,
    private val rejected: Refusals,
    /** Why nothing can be recorded, once the open failed: the counters' reason and the log's text. */
    private val unavailable: () -> Pair<String, String>,
    private val logger: SpoolLogger,
) {
    sealed class Item

    class Pending(
        val name: String,
        val properties: JsonObject,
        val id: String,
        val timestampMs: Long,
        val priority: Priority,
        /** Completed true once the core recorded the event, false when it was refused. */
        val done: CompletableFuture<Boolean>? = null,
    ) : Item()

    /** Runs on the hand-off thread after every event offered before it; `core` is null when the open failed. */
    class Control(val action: (EventSpool?) -> Unit) : Item() {
        val done = CompletableFuture<Unit>()
    }

    private object Stop : Item()

    /** Lock-free: `track()` never waits for the hand-off thread to take its lock. */
    private val queue = ConcurrentLinkedQueue<Item>()
    /** True while the thread sleeps with nothing to do: the next offer wakes it. */
    private val asleep = AtomicBoolean(false)
    private val wakes = AtomicLong()
    /** A linger ends early once this many events wait: a burst is handed over without delay. */
    private val wakeAt = minOf(maxBatch, (capacity / 2).coerceAtLeast(1)).toLong()
    private val room = Semaphore(capacity)
    private val waiting = AtomicLong()
    private val handed = AtomicLong()
    private val waits = AtomicLong()
    private val batches = AtomicLong()
    private val notDurable = AtomicLong()
    private val sendLock = Object()
    @Volatile private var core: EventSpool? = null
    @Volatile private var opened = false
    @Volatile private var closed = false
    @Volatile private var finished = false
    private val thread = Thread(::run, "eventspool-handoff").apply {
        isDaemon = true
        start()
    }

    /** Takes the event, or counts it as `handoff_full` and returns false (never waits, unless [mayWait]). */
    fun offer(p: Pending): Boolean {
        if (!room.tryAcquire()) {
            if (!mayWait()) {
                refused.count("handoff_full") { "the hand-off holds $capacity events already" }
                p.done?.complete(false)
                return false
            }
            waits.incrementAndGet()
            room.acquireUninterruptibly()
        }
        val waitingNow = waiting.incrementAndGet()
        queue.add(p)
        if (waitingNow == wakeAt) wake() else wakeIfAsleep()
        // Lost the race with close(): the thread may be gone, so hand this one over here.
        if (finished) drainHere()
        return true
    }

    /** Queues [action] behind every event offered so far; its future completes once it ran. */
    fun control(action: (EventSpool?) -> Unit): CompletableFuture<Unit> {
        val item = Control(action)
        queue.add(item)
        wake()
        if (finished) drainHere()
        return item.done
    }

    /** Waits until every event offered before this call reached the core (or was refused, counted). */
    fun awaitHandedOff(timeoutMs: Long): Boolean =
        runCatching { control {}.get(timeoutMs.coerceAtLeast(0), TimeUnit.MILLISECONDS) }.isSuccess

    /** Whether the open has finished (successfully or not). */
    val isOpened: Boolean get() = opened

    /** Stops the thread after it handed over what is queued; later items are handled by their callers. */
    fun close(timeoutMs: Long) {
        closed = true
        queue.add(Stop)
        wake()
        thread.join(timeoutMs.coerceAtLeast(1))
        drainHere()
    }

    fun stats() = HandoffStats(
        queued = waiting.get(),
        handedOff = handed.get(),
        batches = batches.get(),
        waits = waits.get(),
        wakes = wakes.get(),
        rejected = rejected.snapshot(),
        refused = refused.snapshot(),
        notDurable = notDurable.get(),
    )

    private fun run() {
        try {
            core = runCatching(open).getOrNull()
            opened = true
            val batch = ArrayList<Pending>(maxBatch)
            while (true) {
                val item = queue.poll()
                if (item == null) {
                    sleep()
                    continue
                }
                if (item === Stop) return
                handle(item, batch)
                // Let the calls of an app's pace gather into the next batch (see the class doc).
                if (item is Pending && !closed && waiting.get() < wakeAt) LockSupport.parkNanos(this, LINGER_NS)
            }
        } finally {
            opened = true
            finished = true
        }
    }

    /** Sleeps until an offer finds the thread asleep (or a control item, or close, wakes it). */
    private fun sleep() {
        asleep.set(true)
        // An offer that came after the poll but saw `asleep` still false is seen here.
        if (queue.isEmpty()) LockSupport.park(this)
        asleep.set(false)
    }

    private fun wakeIfAsleep() {
        if (asleep.get() && asleep.compareAndSet(true, false)) {
            wakes.incrementAndGet()
            LockSupport.unpark(thread)
        }
    }

    /** Ends a linger or a sleep at once (a permit when the thread is busy: its next park returns). */
    private fun wake() {
        asleep.set(false)
        wakes.incrementAndGet()
        LockSupport.unpark(thread)
    }

    /** One item, and for an event every event right behind it (up to [maxBatch]) in the same call. */
    private fun handle(item: Item, batch: ArrayList<Pending>) {
        when (item) {
            is Control -> synchronized(sendLock) {
                try {
                    item.action(core)
                    item.done.complete(Unit)
                } catch (e: Throwable) {
                    item.done.completeExceptionally(e)
                }
            }
            is Pending -> {
                batch.add(item)
                while (batch.size < maxBatch) {
                    val next = queue.peek() as? Pending ?: break
                    if (queue.poll() !== next) break
                    batch.add(next)
                }
                waiting.addAndGet(-batch.size.toLong())
                send(batch)
                batch.clear()
            }
            Stop -> {}
        }
    }

    private fun drainHere() {
        val batch = ArrayList<Pending>()
        while (true) {
            val item = queue.poll() ?: return
            if (item !== Stop) handle(item, batch)
        }
    }

    private fun send(batch: List<Pending>) {
        synchronized(sendLock) {
            // Each event's outcome (recorded or refused); the callers waiting on them are told
            // only once the counts include this batch, so one woken by its event (trackDurably)
            // reads handoffStats() with its batch in them.
            val recorded: BooleanArray = try {
                val core = core
                if (core == null) {
                    val (reason, why) = unavailable()
                    rejected.count(reason, batch.size.toLong()) { why }
                    BooleanArray(batch.size)
                } else {
                    record(core, batch)
                }
            } catch (e: Throwable) {
                // Nothing the FFI reports escapes as an exception; this is a bug, counted all the same.
                rejected.count("internal", batch.size.toLong()) { e.toString() }
                BooleanArray(batch.size)
            } finally {
                batches.incrementAndGet()
                handed.addAndGet(batch.size.toLong())
                room.release(batch.size)
            }
            batch.forEachIndexed { i, p -> p.done?.complete(recorded[i]) }
        }
    }

    /** Hands the batch to the core; returns which of its events the core recorded. */
    private fun record(core: EventSpool, batch: List<Pending>): BooleanArray {
        val lines = StringBuilder(batch.size * 320)
        for (p in batch) lines.append(line(p)).append('\n')
        val report = core.trackBatchReport(lines.toString())
        report.notDurable?.let { reason ->
            val n = report.recorded.toLong()
            val after = notDurable.addAndGet(n)
            if (after - n == 0L || (after - n) / 1_000 != after / 1_000) {
                runCatching { logger.log(SpoolLogger.Level.WARN, "eventspool: $after event(s) recorded in memory only, the store refused them: $reason", null) }
            }
        }
        val all = report.refusedAll
        if (all != null) {
            // The spool's own state (consent denied, disabled, shut down): one step for the batch.
            rejected.count(all.reason, batch.size.toLong()) { all.message }
            return BooleanArray(batch.size)
        }
        val recorded = BooleanArray(batch.size) { true }
        for (r in report.refused) {
            val index = r.line.toInt() - 1
            val p = batch.getOrNull(index) ?: continue
            recorded[index] = false
            rejected.count(r.refusal.reason) { r.refusal.message }
            runCatching { onRejected(HandoffRejected(p.id, r.refusal.reason, r.refusal.message)) }
        }
        return recorded
    }

    private companion object {
        /** How long the thread lets calls gather after a batch: the crash window grows by this much. */
        const val LINGER_NS = 5_000_000L
    }

    private fun line(p: Pending): String {
        val fields = LinkedHashMap<String, kotlinx.serialization.json.JsonElement>(6)
        fields["name"] = JsonPrimitive(p.name)
        fields["properties"] = p.properties
        fields["event_id"] = JsonPrimitive(p.id)
        fields["timestamp"] = JsonPrimitive(Instant.ofEpochMilli(p.timestampMs).toString())
        if (p.priority == Priority.CRITICAL) fields["priority"] = JsonPrimitive("critical")
        return JsonObject(fields).toString()
    }
}

/**
 * What the hand-off did. [refused] counts `track()` calls that recorded nothing, by reason, and
 * [rejected] the events the core refused after `track()` had returned; each reason is logged at
 * its first event and then at most once a minute.
 */
data class HandoffStats(
    /** Events waiting for the hand-off thread now. */
    val queued: Long,
    val handedOff: Long,
    val batches: Long,
    /** `track()` calls that waited for room (only on a thread the spool's `mayWait` allows). */
    val waits: Long,
    /** Times a call woke the sleeping hand-off thread (a system call on the caller's thread). */
    val wakes: Long = 0,
    /** After the hand-off: `event_too_large`, `invalid_event`, `consent_denied`, `spool_failed`, `inactive_process`... */
    val rejected: Map<String, Long>,
    /** At the call: `tracking_disabled`, `consent_denied`, `invalid_event`, `invalid_property`, `handoff_full`, `shut_down`, `spool_failed` (the open failed), `inactive_process` (a process that does not track)... */
    val refused: Map<String, Long> = emptyMap(),
    /** Recorded in memory only: the store refused them (they are still delivered). */
    val notDurable: Long = 0,
)
