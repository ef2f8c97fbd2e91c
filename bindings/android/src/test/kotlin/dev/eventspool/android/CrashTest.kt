package dev.eventspool.android

import org.junit.Assert.assertEquals
import org.junit.Assert.assertNotNull
import org.junit.Test
import org.junit.runner.RunWith
import org.robolectric.RobolectricTestRunner

/** What a crash of the host app costs: the chained uncaught-exception handler persists first. */
@RunWith(RobolectricTestRunner::class)
class CrashTest : AndroidTestBase() {
    @Test
    fun `an uncaught exception writes what memory holds to the store before the process dies`() {
        // durability = spill: the events stay in memory until something persists them.
        val spool = EventSpoolAndroid.install(app, config().apply { durability = "spill" })
        repeat(20) { spool.track("before_crash", mapOf("i" to it)) }
        val before = spool.statsBlocking()
        assertEquals("in memory before the crash: $before", 20uL, before.pendingMemory)
        val handler = Thread.getDefaultUncaughtExceptionHandler()
        assertNotNull("install() chains an uncaught-exception handler", handler)
        // The handler chains to the one before it, whatever that does with the error.
        runCatching { handler!!.uncaughtException(Thread.currentThread(), IllegalStateException("the app crashed")) }
        val after = spool.core.stats()
        assertEquals("in the store once the handler returned: $after", 20uL, after.pendingDisk)
    }
}
