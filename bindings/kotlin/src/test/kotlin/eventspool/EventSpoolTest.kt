package eventspool

import java.lang.ref.WeakReference
import java.nio.file.Path
import java.util.concurrent.atomic.AtomicInteger
import org.junit.jupiter.api.AfterEach
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.BeforeEach
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import org.junit.jupiter.api.io.TempDir
import uniffi.eventspool.Consent
import uniffi.eventspool.DeferReason
import uniffi.eventspool.DeliveryObserver
import uniffi.eventspool.DeliveryState
import uniffi.eventspool.DeliveryStatus
import uniffi.eventspool.EncryptionKey
import uniffi.eventspool.EventSpool
import uniffi.eventspool.NewEvent
import uniffi.eventspool.ObserverHandle
import uniffi.eventspool.Priority
import uniffi.eventspool.SpoolException
import uniffi.eventspool.SpoolNotice

/** The Kotlin bindings against the real library (JNA) and a real collector process. */
class EventSpoolTest {
    @TempDir
    lateinit var dir: Path
    private lateinit var collector: CollectorProcess
    private val db get() = dir.resolve("events.db")

    @BeforeEach
    fun startCollector() {
        collector = CollectorProcess(dir.resolve("collector.db")).start()
    }

    @AfterEach
    fun stopCollector() = collector.stop()

    private fun EventSpool.trackMany(n: Int, name: String = "screen_view"): List<String> =
        (0 until n).map { track(name, """{"screen":"s-${it % 7}","i":$it}""") }

    @Test
    fun `a key from the Keystore seals the store, and a wrong or missing key is refused by id`() {
        // Bytes the app would unwrap with an Android Keystore key.
        val key = ByteArray(32) { it.toByte() }
        val config = fastConfig(collector.url, db).copy(encryptionKeys = listOf(EncryptionKey(1u, key)))
        EventSpool(config, startOffline = true).use { spool ->
            repeat(20) { spool.track("checkout", "{\"email\":\"kt-secret-$it\"}") }
        }
        val storeFiles = dir.toFile().listFiles()!!.filter { it.isFile && it.name.startsWith("events.db") }
        assertTrue(storeFiles.isNotEmpty(), "the store wrote its files")
        for (f in storeFiles) {
            assertFalse(String(f.readBytes(), Charsets.ISO_8859_1).contains("kt-secret-"), "plain text in ${f.name}")
        }
        val wrong = assertThrows<SpoolException.EncryptionKey> {
            EventSpool(config.copy(encryptionKeys = listOf(EncryptionKey(1u, ByteArray(32)))))
        }
        assertEquals(1u, wrong.keyId)
        val missing = assertThrows<SpoolException.EncryptionKey> { EventSpool(config.copy(encryptionKeys = null)) }
        assertEquals(1u, missing.keyId)
        EventSpool(config).use { spool ->
            assertTrue(spool.waitDrained(20_000uL))
            assertEquals(20L, collector.distinct())
        }
    }

    @Test
    fun `tracked offline then drained`() {
        EventSpool(fastConfig(collector.url, db).copy(memoryCapacity = 20uL), startOffline = true).use { spool ->
            assertEquals(150, spool.trackMany(150).toSet().size)
            val status = spool.state()
            assertTrue(status.state is DeliveryState.Offline, "$status")
            assertEquals(150uL, status.pending)
            // The spill thread writes what is past memory_capacity on its own time (it gathers a
            // few events before a commit), so the store is looked at until it has them.
            assertTrue(waitUntil { spool.stats().pendingDisk > 0uL }, "memory_capacity 20 must spill to the store")

            spool.setOnline(true)
            assertTrue(spool.waitDrained(20_000uL))
            assertEquals(150L, collector.distinct())
            assertEquals(150uL, spool.stats().delivered)
        }
    }

    @Test
    fun `outage shows the countdown, then WaitingForUser, and retryNow drains after recovery`() {
        val recorder = Recorder()
        EventSpool(fastConfig(collector.url, db), observer = recorder).use { spool ->
            spool.trackMany(10)
            spool.flush()
            assertTrue(spool.waitDrained(20_000uL))

            collector.stop() // outage: the port refuses connections
            spool.trackMany(25)
            spool.flush()
            assertTrue(waitUntil { spool.state().state is DeliveryState.WaitingForUser })
            // Observers are told on the worker's thread after the state is set, so the recorder
            // may hear of it a little after state() shows it.
            assertTrue(waitUntil { recorder.states().lastOrNull() is DeliveryState.WaitingForUser }, "${recorder.states()}")

            val scheduled = recorder.states().filterIsInstance<DeliveryState.RetryScheduled>()
            // Each retry is announced, then again as its countdown ticks down.
            assertEquals(listOf(1u, 2u, 3u), scheduled.map { it.attempt }.distinct())
            assertEquals(scheduled.map { it.attempt }.sorted(), scheduled.map { it.attempt })
            scheduled.groupBy { it.attempt }.values.forEach { ticks ->
                assertEquals(ticks.map { it.retryInMs }.sortedDescending(), ticks.map { it.retryInMs })
            }
            // Full jitter may draw a delay under a millisecond: an announced retry can say 0 ms.
            assertTrue(scheduled.all { it.maxAttempts == 3u && it.retryInMs in 0uL..200uL }, "$scheduled")
            val waiting = spool.state()
            assertEquals(3u, (waiting.state as DeliveryState.WaitingForUser).attempts)
            assertEquals(25uL, waiting.pending)

            collector.start() // recovery: same port, same database
            spool.retryNow()
            assertTrue(spool.waitDrained(20_000uL))
            assertEquals(35L, collector.distinct())
            val stats = spool.stats()
            assertEquals(35uL, stats.tracked)
            assertEquals(35uL, stats.delivered)
        }
    }

    @Test
    fun `a Kotlin HttpTransport on java-net-http delivers everything`() {
        val transport = JavaHttpTransport()
        EventSpool(fastConfig(collector.url, db, maxBatchEvents = 40uL), transport = transport).use { spool ->
            spool.trackMany(300)
            spool.flush()
            assertTrue(spool.waitDrained(20_000uL))
            assertEquals(300L, collector.distinct())
            assertTrue(transport.calls.get() >= 300 / 40)
            assertEquals(transport.calls.get().toULong(), spool.stats().requests)
        }
    }

    @Test
    fun `bad input raises typed exceptions`() {
        EventSpool(fastConfig(collector.url, db)).use { spool ->
            val e = assertThrows<SpoolException.InvalidEvent> { spool.track("click", "{not json") }
            assertTrue(e.reason.contains("properties_json"), e.reason)
            assertThrows<SpoolException.InvalidEvent> { spool.track("click", "[1, 2]") }
            assertThrows<SpoolException.InvalidEvent> { spool.track("", "{}") }
            assertThrows<SpoolException.InvalidEvent> {
                spool.trackEvent(NewEvent(name = "click", timestamp = "yesterday"))
            }
            val big = assertThrows<SpoolException.EventTooLarge> {
                spool.track("big", """{"blob":"${"x".repeat(40_000)}"}""")
            }
            assertEquals(32uL * 1024uL, big.limit)
            assertEquals(0uL, spool.stats().tracked)
        }
        val e = assertThrows<SpoolException.InvalidConfig> {
            EventSpool(fastConfig(collector.url, db).copy(flushAt = 0uL))
        }
        assertEquals("flush_at", e.field)
        val insecure = assertThrows<SpoolException.InvalidConfig> {
            EventSpool(fastConfig("http://collector.example/v1/batch", db))
        }
        assertEquals("endpoint", insecure.field)
    }

    @Test
    fun `a throwing observer and a throwing transport do not stop delivery`() {
        val observer = ThrowingObserver()
        val transport = FlakyTransport(failures = 2)
        EventSpool(fastConfig(collector.url, db), transport = transport, observer = observer).use { spool ->
            spool.trackMany(40)
            spool.flush()
            assertTrue(spool.waitDrained(20_000uL))
            assertEquals(40L, collector.distinct())
            val stats = spool.stats()
            assertTrue(observer.calls.get() > 0)
            assertTrue(stats.callbackErrors > 0uL, "every throw is counted: $stats")
            assertTrue(transport.left.get() < 0, "the transport threw twice, then delivered")
            assertEquals(40uL, stats.delivered)
        }
    }

    @Test
    fun `close releases everything so the store opens again`() {
        val spool = EventSpool(fastConfig(collector.url, db), startOffline = true)
        spool.use { it.trackMany(12) }
        // After close() the object is gone; a second spool can own the same store at once.
        EventSpool(fastConfig(collector.url, db)).use { again ->
            assertEquals(12uL, again.stats().restored)
            again.flush()
            assertTrue(again.waitDrained(20_000uL))
            assertEquals(12L, collector.distinct())
        }
    }

    @Test
    fun `shutdown then track raises ShutDown`() {
        EventSpool(fastConfig(collector.url, db)).use { spool ->
            spool.shutdown(5_000uL)
            assertThrows<SpoolException.ShutDown> { spool.track("late", "{}") }
            spool.shutdown(5_000uL)
        }
    }

    @Test
    fun `the caller's event id is kept`() {
        EventSpool(fastConfig(collector.url, db)).use { spool ->
            val given = "0193a5b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b"
            val event = NewEvent(
                name = "purchase", propertiesJson = """{"sku":"A-1"}""", eventId = given,
                timestamp = "2026-11-29T11:58:00.001Z", sessionId = "s-1",
            )
            assertEquals(given, spool.trackEvent(event))
            spool.flush()
            assertTrue(spool.waitDrained(20_000uL))
            assertEquals(1L, collector.distinct())
        }
    }

    /** An observer only its registration references (as a screen's would be once it closed). */
    private class Counting(private val calls: AtomicInteger) : DeliveryObserver {
        override fun onState(status: DeliveryStatus) { calls.incrementAndGet() }
        override fun onNotice(notice: SpoolNotice) {}
    }

    /** Registers one; neither the observer nor (when `keep` is false) its handle stays reachable here. */
    private fun register(spool: EventSpool, calls: AtomicInteger, keep: Boolean): Pair<WeakReference<DeliveryObserver>, ObserverHandle?> {
        val observer = Counting(calls)
        val handle = spool.addObserver(observer)
        return WeakReference<DeliveryObserver>(observer) to handle.takeIf { keep }
    }

    @Test
    fun `an observer is let go once its handle is closed or collected`() {
        EventSpool(fastConfig(collector.url, db), startOffline = true).use { spool ->
            val closedCalls = AtomicInteger()
            val (closed, closedHandle) = register(spool, closedCalls, keep = true)
            val (collected, _) = register(spool, AtomicInteger(), keep = false)
            val kept = Recorder() // registered last: once it heard a change, the others did
            spool.addObserver(kept).use {
                spool.track("a", "{}")
                spool.dismiss() // wakes the worker, which shows the new pending count
                assertTrue(waitUntil { kept.statuses.any { it.pending == 1uL } })
                assertTrue(closedCalls.get() > 0, "it was registered")

                closedHandle!!.close()
                val told = closedCalls.get()
                // The closed one at once, the forgotten one once the GC cleaned its handle: the
                // spool holds neither, so both can be collected.
                assertTrue(
                    waitUntil { System.gc(); closed.get() == null && collected.get() == null },
                    "still reachable: closed=${closed.get() != null} collected=${collected.get() != null}",
                )
                val keptBefore = kept.statuses.size
                spool.track("b", "{}")
                spool.setOnline(true)
                assertTrue(spool.waitDrained(20_000uL))
                assertTrue(waitUntil { kept.statuses.drop(keptBefore).any { it.state is DeliveryState.Idle } })
                assertEquals(told, closedCalls.get(), "told after close")
                assertEquals(2L, collector.distinct())
            }
        }
    }

    @Test
    fun `consent pending survives a restart, then granted delivers`() {
        EventSpool(fastConfig(collector.url, db).copy(consent = "pending")).use { spool ->
            assertEquals(Consent.PENDING, spool.consent())
            spool.trackMany(25)
            spool.flush()
            assertTrue(waitUntil {
                val s = spool.state()
                s.pending == 25uL && s.state == DeliveryState.Deferred(DeferReason.CONSENT)
            }, "${spool.state()}")
        }
        assertEquals(0L, collector.distinct(), "nothing sent while pending")
        EventSpool(fastConfig(collector.url, db)).use { spool ->
            assertEquals(Consent.PENDING, spool.consent(), "the store remembers")
            assertEquals(25uL, spool.stats().restored)
            spool.setConsent(Consent.GRANTED)
            assertTrue(spool.waitDrained(20_000uL))
            assertEquals(25L, collector.distinct())
        }
    }

    @Test
    fun `consent denied deletes what was kept and refuses new events`() {
        EventSpool(fastConfig(collector.url, db).copy(consent = "pending", memoryCapacity = 5uL)).use { spool ->
            val mark = "kt-consent-secret-91be"
            repeat(30) { spool.track("private", """{"secret":"$mark-$it"}""") }
            spool.persist()
            spool.setConsent(Consent.DENIED)
            assertThrows<SpoolException.ConsentDenied> { spool.track("after", "{}") }
            val stats = spool.stats()
            assertEquals(30uL, stats.dropped["consent_denied"])
            assertEquals(0uL, stats.pending)
            assertTrue(waitUntil { spool.state().state is DeliveryState.Disabled })
            spool.shutdown(5_000uL)
            val left = dir.toFile().listFiles()!!.filter { f ->
                f.isFile && f.name.startsWith("events.db") && String(f.readBytes(), Charsets.ISO_8859_1).contains(mark)
            }
            assertEquals(emptyList<java.io.File>(), left, "nothing of the user's data left")
        }
        assertEquals(0L, collector.distinct())
        EventSpool(fastConfig(collector.url, db)).use { spool ->
            assertEquals(Consent.DENIED, spool.consent())
        }
    }

    @Test
    fun `a critical event is delivered with the backlog`() {
        EventSpool(fastConfig(collector.url, db), startOffline = true).use { spool ->
            spool.trackMany(200)
            spool.trackEvent(NewEvent(name = "crash", propertiesJson = "{}", priority = Priority.CRITICAL))
            spool.setOnline(true)
            assertTrue(spool.waitDrained(20_000uL))
            assertEquals(201L, collector.distinct())
        }
    }
}
