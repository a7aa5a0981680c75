"""Alerts when away: messages about runs and the session sent through Apprise to the URLs a
user configured once (ntfy, Telegram, Slack, Discord, email, webhooks)."""
