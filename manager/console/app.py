"""The console itself: a textual app over `feed` (what is read and done) and `model` (what is
drawn).

Two workers of the app's own group keep it live: one follows the event stream and wakes the
other, which reads the roster and this root's seats again at once (and every `poll_s` anyway,
the backstop for an event the stream lost), so a change is on screen as soon as its event
arrives and the manager has answered. A manager that does not answer is said on the status
line and asked again; nothing the manager or the broker does ends the app.

Every verb asks first (`Confirm`), then runs in a worker of its own, so the table stays live
while a move or a drain takes minutes; what it said lands on the line under the table, and a
refusal there too, in the CLI's own words.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import anyio
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Footer, Header, Input, Label, Log, Static

from manager.console import feed
from manager.console.model import Board, SeatLine, View
from protocol.errors import Refusal
from protocol.events import Event
from protocol.instant import now_iso

COLUMNS = (
    ("NAME", "name"),
    ("HOST", "host"),
    ("STATE", "state"),
    ("TURN", "turn"),
    ("INBOX", "inbox"),
    ("DEAD", "dead"),
    ("TOKENS", "tokens"),
    ("COST", "cost"),
    ("INSTANCE", "instance"),
)
# After a broken event stream, how long before it is followed again.
EVENTS_RETRY_S = 2.0


class Confirm(ModalScreen[bool]):
    """Asks before a verb acts: `y` or the button goes on, `n`, Escape or the other button
    does nothing."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "yes"),
        Binding("n", "answer(False)", "no"),
        Binding("escape", "answer(False)", "no"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.question, id="question")
            with Horizontal(id="buttons"):
                yield Button("Yes (y)", variant="error", id="yes")
                yield Button("No (n)", variant="primary", id="no")

    def on_mount(self) -> None:
        # Enter on the focused button must not act by accident: No has the focus.
        self.query_one("#no", Button).focus()

    @on(Button.Pressed)
    def pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class Ask(ModalScreen[str | None]):
    """One line of text for a verb (the message to send, the destination of a move); Escape
    gives nothing."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel")]

    def __init__(self, prompt: str, placeholder: str = "") -> None:
        super().__init__()
        self.prompt = prompt
        self.placeholder = placeholder

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.prompt, id="question")
            yield Input(placeholder=self.placeholder, id="answer")

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConsoleApp(App[None]):
    TITLE = "cotal console"
    CSS = """
    #status { height: 1; background: $boost; }
    #status.down { background: $error; color: $text; }
    #top { height: 1fr; }
    #seats { width: 3fr; }
    #rail { width: 1fr; min-width: 30; border-left: solid $accent; }
    #rail-title { text-style: bold; color: $warning; }
    #tails { height: 14; }
    #tails Log { width: 1fr; border: solid $primary-lighten-2; }
    #said { height: 1; }
    Confirm, Ask { align: center middle; }
    #dialog { width: 80; height: auto; padding: 1 2; border: thick $warning; background: $surface; }
    #buttons { height: auto; margin-top: 1; }
    #buttons Button { margin-right: 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("x", "stop", "stop"),
        Binding("s", "start", "start"),
        Binding("r", "restart", "restart"),
        Binding("m", "send", "send"),
        Binding("v", "move", "move"),
        Binding("d", "drain", "drain host"),
        Binding("l", "tails", "reload tails"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, root: Path, *, poll_s: float = 2.0, follow_events: bool = True) -> None:
        super().__init__()
        self.root = root
        self.poll_s = poll_s
        self.follow_events = follow_events
        self.board = Board()
        self.reader = feed.Reader(root, depth_every=poll_s)
        self.view: View = self.board.view(datetime.now(UTC))
        self._wake = anyio.Event()
        self._order: list[str] = []
        self._tailed: str | None = None
        # Called with each view drawn (bench/console.py times the redraw with it).
        self.on_view: Callable[[View], None] | None = None

    # -- layout ---------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("starting", id="status")
        with Horizontal(id="top"):
            yield DataTable(id="seats", cursor_type="row", zebra_stripes=True)
            with Vertical(id="rail"):
                yield Static("NEEDS YOU", id="rail-title")
                yield Static("nothing", id="needs")
        with Horizontal(id="tails"):
            yield Log(id="log", auto_scroll=True)
            yield Log(id="transcript", auto_scroll=True)
        yield Static("", id="said")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = str(self.root)
        table = self.query_one("#seats", DataTable)
        for label, key in COLUMNS:
            table.add_column(label, key=key)
        self.query_one("#log", Log).border_title = "log (cotal logs SEAT)"
        self.query_one("#transcript", Log).border_title = "transcript (--transcript)"
        self._poll()
        if self.follow_events:
            self._follow()

    # -- keeping it live -------------------------------------------------------------------------

    @work(group="feed", exit_on_error=False)
    async def _poll(self) -> None:
        while True:
            self._wake = anyio.Event()
            await self.read_once()
            with anyio.move_on_after(self.poll_s):
                await self._wake.wait()

    async def read_once(self) -> None:
        try:
            read = await self.reader.read()
        except Exception as exc:
            self.board.unreachable(feed.down_reason(exc))
        else:
            self.board.roster(read.fleet, read.local, now_iso(), read.depths)
        self.redraw()

    @work(group="feed", exit_on_error=False)
    async def _follow(self) -> None:
        replay = True
        while True:
            url, why = await anyio.to_thread.run_sync(feed.broker_of, self.root)
            if url is None:
                self.board.events_down = why
            else:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._broker_watch, url, tg.cancel_scope)
                    await self._stream(replay)
                    tg.cancel_scope.cancel()
                # Replayed once: a second replay would count the same dead letters twice.
                replay = False
            self.redraw()
            await anyio.sleep(EVENTS_RETRY_S)

    async def _stream(self, replay: bool) -> None:
        try:
            async with contextlib.aclosing(feed.events(self.root, replay=replay)) as stream:
                self.board.events_down = None
                async for event in stream:
                    self.heard(event)
            # The broker ended the stream: followed again by the caller.
            self.board.events_down = "the stream ended"
        except Exception as exc:
            self.board.events_down = (
                exc.text if isinstance(exc, Refusal) else f"{type(exc).__name__}: {exc}"
            )

    async def _broker_watch(self, url: str, scope: anyio.CancelScope) -> None:
        """Ends the stream when this root's broker is no longer the one it reads: a connection
        to a broker that stopped retries it forever, and a mesh brought up again may have its
        embedded broker on another port."""
        while True:
            await anyio.sleep(EVENTS_RETRY_S)
            now, why = await anyio.to_thread.run_sync(feed.broker_of, self.root)
            if now != url:
                self.board.events_down = why or f"the broker is now {now}"
                scope.cancel()
                return

    def heard(self, event: Event) -> None:
        self.board.apply(event)
        self._wake.set()
        # The tails follow the selected seat's events, when its files are this root's: another
        # host's seat of the same name has only a stale log here (what it did before it left).
        seat = self.selected()
        if seat is not None and seat.here and event.seat == seat.name == self._tailed:
            self.load_tails(seat.name)

    # -- drawing ---------------------------------------------------------------------------------

    def redraw(self) -> None:
        view = self.board.view(datetime.now(UTC))
        self.view = view
        status = self.query_one("#status", Static)
        status.update(view.status)
        status.set_class(self.board.manager_down is not None, "down")
        self._table(view.seats)
        needs = self.query_one("#needs", Static)
        needs.update("\n".join(f"[{n.kind}] {n.text}" for n in view.needs) or "nothing")
        if self.on_view is not None:
            self.on_view(view)

    def _table(self, seats: tuple[SeatLine, ...]) -> None:
        table = self.query_one("#seats", DataTable)
        order = [f"{s.name}/{s.uid}" for s in seats]
        if order != self._order:
            selected = self.selected()
            table.clear()
            for seat in seats:
                table.add_row(
                    *(getattr(seat, key) for _, key in COLUMNS), key=f"{seat.name}/{seat.uid}"
                )
            self._order = order
            if selected is not None and f"{selected.name}/{selected.uid}" in order:
                table.move_cursor(row=order.index(f"{selected.name}/{selected.uid}"))
            return
        for seat in seats:
            row = f"{seat.name}/{seat.uid}"
            for _, key in COLUMNS:
                value = getattr(seat, key)
                if table.get_cell(row, key) != value:
                    table.update_cell(row, key, value)

    def selected(self) -> SeatLine | None:
        table = self.query_one("#seats", DataTable)
        if not self._order or not 0 <= table.cursor_row < len(self._order):
            return None
        key = self._order[table.cursor_row]
        return next((s for s in self.view.seats if f"{s.name}/{s.uid}" == key), None)

    def say(self, text: str) -> None:
        self.query_one("#said", Static).update(text)

    # -- a seat's log and transcript ---------------------------------------------------------------

    @on(DataTable.RowHighlighted)
    def highlighted(self, _event: DataTable.RowHighlighted) -> None:
        seat = self.selected()
        if seat is not None and seat.name != self._tailed:
            self._tailed = seat.name
            self._show_tails(seat)

    def action_tails(self) -> None:
        seat = self.selected()
        if seat is not None:
            self._show_tails(seat)

    def _show_tails(self, seat: SeatLine) -> None:
        if seat.here:
            self.load_tails(seat.name)
            return
        elsewhere = (
            f"{seat.name} runs at {seat.instance} ({seat.host}): its log and transcript are "
            "files of that root; run `cotal console` there"
        )
        self._fill(elsewhere, elsewhere)

    @work(group="tails", exclusive=True, exit_on_error=False)
    async def load_tails(self, name: str) -> None:
        log = await anyio.to_thread.run_sync(feed.log_tail, self.root, name)
        transcript = await anyio.to_thread.run_sync(feed.transcript_tail, self.root, name)
        self._fill(log, transcript)

    def _fill(self, log: str, transcript: str) -> None:
        for widget_id, text in (("#log", log), ("#transcript", transcript)):
            widget = self.query_one(widget_id, Log)
            widget.clear()
            widget.write(text)

    # -- the verbs -----------------------------------------------------------------------------

    def _ours(self) -> SeatLine | None:
        """The selected seat, when this root's manager holds it; else why not, said."""
        seat = self.selected()
        if seat is None:
            self.say("no seat selected: pick one with the arrow keys")
            return None
        if not seat.here:
            self.say(
                f"{seat.name} is held by {seat.instance} ({seat.host}), not by this root's "
                "manager: run `cotal console` (or the verb) at its root"
            )
            return None
        return seat

    def _confirmed(self, question: str, verb: str, act: Callable[[], Awaitable[str]]) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self.say(f"{verb}: running")
                self._run(verb, act)
            else:
                self.say(f"{verb}: not done")

        self.push_screen(Confirm(question), answered)

    @work(group="verbs", exit_on_error=False)
    async def _run(self, verb: str, act: Callable[[], Awaitable[str]]) -> None:
        try:
            line = await act()
        except Refusal as exc:
            line = f"{verb} refused: {exc.code}: {exc.text}"
            if verb.startswith("move"):
                self.board.refused(verb.split()[-1], line)
        except Exception as exc:
            line = f"{verb} failed: {type(exc).__name__}: {exc}"
        self.say(line)
        self._wake.set()
        self.redraw()

    def action_stop(self) -> None:
        if seat := self._ours():
            name = seat.name
            self._confirmed(
                f"Stop {name}? Its inbox, session and custody are kept (`cotal stop {name}`).",
                f"stop {name}",
                lambda: feed.stop(self.root, name),
            )

    def action_start(self) -> None:
        if seat := self._ours():
            name = seat.name
            self._confirmed(
                f"Start {name} again, in its session (`cotal start {name}`)?",
                f"start {name}",
                lambda: feed.start(self.root, name),
            )

    def action_restart(self) -> None:
        if seat := self._ours():
            name = seat.name
            self._confirmed(
                f"Restart {name}: stop it, prove the exit, start it (`cotal restart {name}`)?",
                f"restart {name}",
                lambda: feed.restart(self.root, name),
            )

    def action_send(self) -> None:
        if not (seat := self._ours()):
            return
        name = seat.name

        def typed(text: str | None) -> None:
            if not text:
                self.say(f"send to {name}: nothing typed, nothing sent")
                return
            self._confirmed(
                f"Send to {name}: {text!r}?",
                f"send {name}",
                lambda: feed.send(self.root, name, text),
            )

        self.push_screen(Ask(f"Message to {name} (Enter sends after a confirm)"), typed)

    def _others(self) -> str:
        ours = self.board.instance
        live = sorted(
            {(f.instance, f.host) for f in self.board.fleet if f.manager_live and f.instance}
        )
        return ", ".join(f"{i} ({h})" for i, h in live if i != ours) or "none seen"

    def action_move(self) -> None:
        if not (seat := self._ours()):
            return
        name = seat.name

        def typed(to: str | None) -> None:
            if not to:
                self.say(f"move {name}: no destination, nothing moved")
                return
            self._confirmed(
                f"Move {name} to {to}? It is cut at a turn boundary here and adopted there "
                f"(`cotal move {name} --to {to}`).",
                f"move {name}",
                lambda: feed.move(self.root, name, to, self.say),
            )

        self.push_screen(
            Ask(f"Move {name} to which manager? Live: {self._others()}", "INSTANCE"), typed
        )

    def action_drain(self) -> None:
        def typed(to: str | None) -> None:
            if to is None:
                self.say("drain: not done")
                return
            where = to or "the fleet's managers, by free room"
            flag = f"--to {to}" if to else "--fleet"
            self._confirmed(
                f"Drain this host: move every seat of {self.root} to {where} "
                f"(`cotal drain {flag}`)?",
                "drain",
                lambda: feed.drain(self.root, to or None, self.say, self.board.refused),
            )

        self.push_screen(
            Ask(
                f"Drain this host to which manager? Empty: --fleet. Live: {self._others()}",
                "INSTANCE, or empty for --fleet",
            ),
            typed,
        )

    async def action_quit(self) -> None:
        await self.reader.aclose()
        self.exit()
