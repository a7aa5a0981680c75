"""``%notify``: where alerts about runs and the session go (ntfy, Telegram, Slack, email...)."""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ipycloud.magics._arguments import help_option, parse_line, refuse_options
from ipycloud.magics._display import Notice

ACTIONS = ("list", "add", "remove", "test")
NONE_YET = ("no alert URL yet: %notify add URL, with an Apprise URL such as "
            "ntfy://ntfy.sh/your-topic")


@magics_class
class NotifyMagics(Magics):
    """Send alerts about training runs and the session to your phone or chat."""

    @help_option
    @magic_arguments()
    @argument("action", nargs="?", default="list", choices=ACTIONS, help="what to do")
    @argument("target", nargs="?",
              help="add: an Apprise URL; remove: its number in the list, or the URL")
    @line_magic
    def notify(self, line: str = "") -> Notice:
        """Send alerts when away: a run of ``ipycloud.fit`` finished, failed (with the
        error's line), paused or stopped early; a kernel died out of memory (seen by the
        Jupyter server extension); the session limit is near (``%keepalive``).

        A URL is an Apprise URL (https://github.com/caronc/apprise/wiki): ``ntfy://``,
        ``tgram://``, ``slack://``, ``discord://``, ``mailto://``, ``json://`` and about a
        hundred more. It is saved once for every notebook of this user, in
        ``~/.config/ipycloud/notify.json`` (``$IPYCLOUD_CONFIG_DIR``), readable by you
        only, and shown only masked. ``$IPYCLOUD_NOTIFY`` adds URLs, comma-separated. At
        most one alert of a kind goes out per minute; alerts are sent by a thread of their
        own, so a notifier that fails or hangs never slows training. Needs
        ``pip install 'ipycloud[notify]'``.

        Examples
        --------
        ::

            %notify add ntfy://ntfy.sh/my-private-topic
            %notify test
            %notify list
            %notify remove 1

        Keep a URL out of the notebook::

            from getpass import getpass
            url = getpass("Apprise URL: ")
            %notify add $url
        """
        args = parse_line(self.notify, line)
        if args.action in ("add", "remove") and not args.target:
            raise UsageError(f"%notify {args.action}: give "
                             f"{'the URL' if args.action == 'add' else 'its number'} "
                             "(see %notify? for usage)")
        if args.action in ("list", "test"):
            refuse_options(self.notify, args, set(), args.action)
            if args.target:
                raise UsageError(f"%notify {args.action} takes nothing more: "
                                 f"{args.target!r} (see %notify? for usage)")
        from ipycloud.runtime import notify

        try:
            if args.action == "add":
                return Notice(f"alerts go to {notify.add_url(args.target)} from now on "
                              f"(saved in {notify.urls.config_file()}, readable by you only)")
            if args.action == "remove":
                return Notice(f"alerts no longer go to {notify.remove_url(args.target)}")
            if args.action == "test":
                return Notice("\n".join(
                    f"test alert sent to {url}" if problem is None
                    else f"test alert NOT sent to {url}: {problem}"
                    for url, problem in notify.send_test()))
            listed = notify.list_urls()
        except (ValueError, ImportError) as error:
            raise UsageError(f"%notify {args.action}: {error}") from None
        if not listed:
            return Notice(NONE_YET)
        return Notice("alerts go to:\n" + "\n".join(
            f"  {number}  {url}" for number, url in enumerate(listed, 1)))
