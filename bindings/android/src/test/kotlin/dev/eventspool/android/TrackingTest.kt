package dev.eventspool.android

import java.time.Instant
import java.util.Date
import org.junit.Assert.assertEquals
import org.junit.Assert.assertTrue
import org.junit.Test
import org.junit.runner.RunWith
import org.robolectric.RobolectricTestRunner

/** What `track()` takes on Android: times, enums, nested collections, and nothing that throws. */
@RunWith(RobolectricTestRunner::class)
class TrackingTest : AndroidTestBase() {
    @Test
    fun `a Date property arrives as ISO 8601`() {
        val spool = EventSpoolAndroid.install(app, config())
        network(validated = true)
        spool.track("dated", mapOf("at" to Date.from(Instant.parse("2026-05-06T07:08:09.010Z"))))
        spool.flushBlocking()
        assertTrue(spool.waitDrainedBlocking(20_000))
        assertEquals(listOf("""{"at":"2026-05-06T07:08:09.010Z"}"""), collector.storedProperties("dated"))
    }
}
