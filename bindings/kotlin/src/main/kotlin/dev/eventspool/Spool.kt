package dev.eventspool

import java.util.UUID
import java.util.concurrent.ThreadLocalRandom
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.flow.MutableStateFlow
import kotlinx.coroutines.flow.StateFlow
import kotlinx.coroutines.flow.asStateFlow
import kotlinx.coroutines.runInterruptible
import uniffi.eventspool.DeliveryConditions
import uniffi.eventspool.DeliveryObserver
import uniffi.eventspool.DeliveryStatus
import uniffi.eventspool.DrainOutcome
import uniffi.eventspool.EventSpool
import uniffi.eventspool.HttpTransport
import uniffi.eventspool.NewEvent
import uniffi.eventspool.SpoolConfig
import uniffi.eventspool.SpoolException
import uniffi.eventspool.SpoolNotice
import uniffi.eventspool.SpoolStats

/**
 * The Kotlin face of eventspool: `track(name, mapOf(...))`, the delivery state as a [StateFlow],
 * `suspend` flush / wait / shutdown. Everything else of the generated API stays reachable as [core].
 *
 * `track()` costs about a microsecond on the calling thread (see [Handoff]); under
 * `durability = always` it records the event itself and returns only once it is stored.
 */
class Spool(
    config: SpoolConfig,
    transport: HttpTransport? = null,
    startOffline: Boolean = false,
    /** Records waiting for the hand-off thread at most; when full, `track()` waits for room. */
    handoffCapacity: Int = DEFAULT_HANDOFF_CAPACITY,
    /** Called on the hand-off thread for an event the core refused after `track()` returned. */
    onRejected: (HandoffRejected) -> Unit = {},
) : AutoCloseable {
    /** The generated spool, for what this layer does not wrap (quarantine, purge, conditions...). */
    val core: EventSpool = EventSpool(config, transport, null, startOffline)

    private val durable = config.durability == "always"
    private val handoff = Handoff(core, handoffCapacity.also { require(it > 0) { "handoffCapacity must be > 0" } }, MAX_BATCH, onRejected)
    private val statusFlow = MutableStateFlow(core.state())
    private val observer = core.addObserver(object : DeliveryObserver {
        override fun onState(status: DeliveryStatus) {
            statusFlow.value = status
        }
        override fun onNotice(notice: SpoolNotice) {}
    })
    @Volatile private var enabled = true
    @Volatile private var closed = false

    /** The delivery state; updated on the SDK's worker thread, collect it on any dispatcher. */
    val status: StateFlow<DeliveryStatus> = statusFlow.asStateFlow()

    /**
     * Records an event and returns its `event_id` (fixed now, kept through every retry).
     * Throws [PropertyException] for a value with no JSON form, and the core's
     * [SpoolException.InvalidEvent] / [SpoolException.TrackingDisabled] / [SpoolException.ShutDown]
     * for what can be told at once; what only the core can tell later (too large, storage) goes
     * to `onRejected` and [handoffStats] (under `durability = always`, it is thrown here).
     */
    fun track(name: String, properties: Map<String, Any?> = emptyMap()): String {
        if (closed) throw SpoolException.ShutDown()
        if (!enabled) throw SpoolException.TrackingDisabled()
        if (name.isEmpty()) throw SpoolException.InvalidEvent("name is empty")
        val json = Properties.toJson(properties)
        val now = System.currentTimeMillis()
        val id = uuidV7(now)
        if (durable) {
            core.trackEvent(NewEvent(name = name, propertiesJson = json.toString(), eventId = id, timestamp = java.time.Instant.ofEpochMilli(now).toString()))
            return id
        }
        handoff.offer(Handoff.Pending(name, json, id, now))
        return id
    }

    fun setOnline(online: Boolean) = core.setOnline(online)
    fun setForeground(foreground: Boolean) = core.setForeground(foreground)

    /** The device's conditions (metered, power saving, low battery); the config's `deliverOn*` decide. */
    fun setConditions(conditions: DeliveryConditions) = core.setConditions(conditions)
    fun retryNow() = core.retryNow()
    fun state(): DeliveryStatus = core.state()

    /** Opt-out: what was tracked before is recorded first; later `track()` calls throw TrackingDisabled. */
    fun setEnabled(enabled: Boolean) {
        this.enabled = enabled
        if (!enabled) handoff.awaitHandedOff(HANDOFF_WAIT_MS)
        core.setEnabled(enabled)
    }

    /** Hands over what `track()` accepted, then writes the core's memory to the store (app to background). */
    fun persist(): ULong {
        handoff.awaitHandedOff(HANDOFF_WAIT_MS)
        return core.persist()
    }

    /** The core's figures, once what was tracked before this call reached it. */
    fun stats(): SpoolStats {
        handoff.awaitHandedOff(HANDOFF_WAIT_MS)
        return core.stats()
    }

    fun handoffStats(): HandoffStats = handoff.stats()

    /** Blocking flush, for code that is not in a coroutine (never on a UI thread). */
    fun flushBlocking() {
        handoff.awaitHandedOff(HANDOFF_WAIT_MS)
        core.flush()
    }

    /** Sends what is pending now; returns once it was handed to the worker (not when delivered). */
    suspend fun flush() = runInterruptible(Dispatchers.IO) { flushBlocking() }

    /** Suspends until nothing is pending and delivery is idle, or [timeoutMs] passed; false then. */
    suspend fun awaitDrained(timeoutMs: Long): Boolean = runInterruptible(Dispatchers.IO) { waitDrainedBlocking(timeoutMs) }

    fun waitDrainedBlocking(timeoutMs: Long): Boolean {
        val start = System.nanoTime()
        if (!handoff.awaitHandedOff(timeoutMs)) return false
        val left = timeoutMs - (System.nanoTime() - start) / 1_000_000
        return left > 0 && core.waitDrained(left.toULong())
    }

    /**
     * The bounded drain for a platform's background job: hands over what `track()` accepted,
     * then runs the core's `deliverWithin` with what is left of [budgetMs]. The outcome can
     * come up to the config's `attemptTimeoutMs` after the budget (a request in flight is
     * waited for), so pass the platform's budget minus that. Never on a UI thread.
     */
    fun deliverWithinBlocking(budgetMs: Long): DrainOutcome {
        val start = System.nanoTime()
        handoff.awaitHandedOff(budgetMs.coerceAtLeast(0))
        val left = budgetMs - (System.nanoTime() - start) / 1_000_000
        return core.deliverWithin(left.coerceAtLeast(0).toULong())
    }

    suspend fun deliverWithin(budgetMs: Long): DrainOutcome = runInterruptible(Dispatchers.IO) { deliverWithinBlocking(budgetMs) }

    /** Hands over the rest, stops delivery (waiting at most [timeoutMs] for a request), persists, releases the store. */
    suspend fun shutdown(timeoutMs: Long = 5_000) = runInterruptible(Dispatchers.IO) { shutdownBlocking(timeoutMs) }

    fun shutdownBlocking(timeoutMs: Long = 5_000) {
        if (closed) return
        closed = true
        handoff.close(timeoutMs)
        observer.close()
        core.shutdown(timeoutMs.toULong())
        statusFlow.value = core.state()
    }

    /** Shuts down (5 s for a request in flight) and frees the native object. */
    override fun close() {
        shutdownBlocking()
        core.close()
    }

    companion object {
        const val DEFAULT_HANDOFF_CAPACITY = 4096
        /** Events per `track_batch` call: big enough to spread the FFI cost, small enough to keep a batch quick. */
        const val MAX_BATCH = 512
        private const val HANDOFF_WAIT_MS = 10_000L

        /** A UUIDv7 (time-ordered, as the core's own ids) from a thread-local generator: no lock, no syscall. */
        internal fun uuidV7(nowMs: Long): String {
            val r = ThreadLocalRandom.current()
            val msb = (nowMs shl 16) or 0x7000L or (r.nextLong() and 0x0FFFL)
            val lsb = (r.nextLong() and 0x3FFFFFFFFFFFFFFFL) or Long.MIN_VALUE
            return UUID(msb, lsb).toString()
        }
    }
}
