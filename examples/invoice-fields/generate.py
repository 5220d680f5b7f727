#!/usr/bin/env python3
"""Generate the synthetic invoices of the invoice-fields example.

Each record is an invoice, receipt, reminder, e-mail or short note from an accountant, in one
of 14 layouts, with the eight fields to extract: vendor, invoice_number, date, total, currency,
due_date (optional), po_number (optional) and line_items (optional: a list of objects with
description, quantity and amount, for the layouts that list the items). Dates, amounts and currencies are written in many
formats; every text also carries distractors (subtotal, tax, phone numbers, customer ids,
order dates, the billed company) so that the task is not "copy the first number".

Standard library only and seeded: running it again rewrites data/invoices.jsonl byte for byte.

    python examples/invoice-fields/generate.py            # rewrite data/invoices.jsonl
    python examples/invoice-fields/generate.py --stats    # also print counts and lengths
    python examples/invoice-fields/generate.py --out DIR  # write DIR/invoices.jsonl instead
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import re
from collections.abc import Callable
from pathlib import Path

SEED = 1234
N_INVOICES = 462  # 33 per layout, 14 layouts
MAX_WORDS = 140
# pilot.yaml has max_length 384 tokens for prompt + answer; the prompt scaffolding takes ~65
# and the JSON answer up to ~100, so a text may use at most ~200. approx_tokens() never
# underestimates the SmolLM2 tokenizer on these texts (checked once against it).
MAX_TEXT_TOKENS = 185
MAX_JACCARD = 0.6  # word-set similarity allowed between any two texts
FILENAME = "invoices.jsonl"
KEYS = ["vendor", "invoice_number", "date", "total", "currency", "due_date", "po_number",
        "line_items"]

# --------------------------------------------------------------------------- pools

VENDOR_STEMS = [
    "Northwind", "Bluebird", "Kestrel", "Harbor & Finch", "Meridian", "Copperleaf", "Saltmarsh",
    "Brightline", "Oakridge", "Silverpine", "Redwood", "Alder", "Quarry Lane", "Ninefold",
    "Lakeside", "Helix", "Pioneer", "Granite", "Willow", "Summit", "Cobalt", "Ember", "Fernhill",
    "Tidewater", "Juniper", "Marlow", "Orchard", "Polaris", "Riverbend", "Stonegate", "Larkspur",
    "Bramble", "Westbrook", "Halcyon", "Foxglove", "Ironbark",
]
# (suffix, home currency or None for "any")
VENDOR_KINDS = [
    ("Office Supply", None), ("Cloud Services Ltd", "GBP"), ("Print Co.", None),
    ("Catering", None), ("IT Solutions GmbH", "EUR"), ("Legal LLP", "GBP"),
    ("Logistics Inc.", "USD"), ("Design Studio", None), ("Cleaning Services", None),
    ("Electrical Ltd", "GBP"), ("Consulting LLC", "USD"), ("Hardware", None),
    ("Coffee Roasters", None), ("Software B.V.", "EUR"), ("Facilities Management", None),
    ("Marketing Agency", None), ("Plumbing & Heating", None), ("Translation Services", None),
    ("Security Systems AG", "CHF"), ("Media AB", "SEK"), ("Telecom Pty Ltd", "AUD"),
    ("Freight Canada Inc.", "CAD"), ("Trading K.K.", "JPY"), ("Analytics SAS", "EUR"),
]
CLIENTS = [
    "Acme Robotics", "Bright Path Consulting", "Harbor Dental Group", "Nordlicht Design",
    "Greenway Farms", "Tallis & Co", "Blue Fern Studio", "Orbit Analytics", "Pinecrest School",
    "Riverside Clinic", "Moonbeam Bakery", "Vantage Architects", "Crescent Hotels",
]
PEOPLE = [
    "Anna Schmidt", "Ben Carter", "Carla Rossi", "David Okafor", "Elena Petrova", "Farid Haddad",
    "Grace Lee", "Hiro Tanaka", "Ines Silva", "Jonas Berg", "Kemi Adeyemi", "Liam Murphy",
    "Maya Patel", "Noah Fischer", "Priya Nair", "Sam Novak", "Zoe Martin", "Tom Evans",
]
ITEMS = [
    "Printer paper A4 (box)", "Toner cartridge", "Consulting hours", "Website maintenance",
    "Cloud hosting (monthly)", "Office cleaning", "Catering - team lunch", "Logo redesign",
    "Network switch", "Laptop stand", "Legal advice", "Translation, 2,400 words",
    "Coffee beans 1kg", "Desk chairs", "Security audit", "Freight charge", "Software licence",
    "Support plan", "Cable installation", "Brochure printing", "Data analysis", "Pipe repair",
    "Monitor 27in", "Onboarding workshop", "Annual subscription", "Travel expenses",
]
STREETS = ["Maple Ave", "High Street", "Elm Road", "Kingsway", "Baker St", "Harbour Rd", "Main St",
           "Station Road", "Market Square", "Mill Lane", "Park Blvd"]
CITIES = {
    "USD": ["Portland, OR 97205", "Austin, TX 78701", "Denver, CO 80202", "Madison, WI 53703"],
    "EUR": ["10115 Berlin", "1012 Amsterdam", "75002 Paris", "20121 Milano"],
    "GBP": ["Leeds LS1 4AP", "Bristol BS1 5TR", "Manchester M1 2AB", "Edinburgh EH1 1YZ"],
    "CAD": ["Toronto, ON M5V 2T6", "Vancouver, BC V6B 1A1"],
    "AUD": ["Sydney NSW 2000", "Melbourne VIC 3000"],
    "CHF": ["8001 Zurich", "1204 Geneva"],
    "SEK": ["111 22 Stockholm", "411 05 Goteborg"],
    "JPY": ["Shibuya-ku, Tokyo 150-0002", "Kita-ku, Osaka 530-0001"],
}
PHONES = {
    "USD": lambda r: f"+1 ({r.randint(201, 989)}) 555-{r.randint(100, 9999):04d}",
    "CAD": lambda r: f"+1 {r.randint(204, 905)} 555 {r.randint(100, 9999):04d}",
    "EUR": lambda r: f"+49 30 {r.randint(1000000, 9999999)}",
    "GBP": lambda r: f"0{r.randint(113, 207)} {r.randint(100, 999)} {r.randint(1000, 9999)}",
    "AUD": lambda r: f"+61 2 {r.randint(1000, 9999)} {r.randint(1000, 9999)}",
    "CHF": lambda r: f"+41 44 {r.randint(100, 999)} {r.randint(10, 99)} {r.randint(10, 99)}",
    "SEK": lambda r: f"+46 8 {r.randint(100, 999)} {r.randint(10, 99)} {r.randint(10, 99)}",
    "JPY": lambda r: f"+81 3-{r.randint(1000, 9999)}-{r.randint(1000, 9999)}",
}
CURRENCY_WEIGHTS = {"USD": 46, "EUR": 20, "GBP": 15, "CAD": 5, "AUD": 5, "CHF": 3, "JPY": 3, "SEK": 3}
TAX_RATES = {"USD": [0, 0.06, 0.0725, 0.08], "EUR": [0.19, 0.21, 0.2], "GBP": [0.2, 0],
             "CAD": [0.05, 0.13], "AUD": [0.1], "CHF": [0.081], "SEK": [0.25], "JPY": [0.1]}
TAX_NAMES = {"USD": "Sales tax", "EUR": "VAT", "GBP": "VAT", "CAD": "GST/HST", "AUD": "GST",
             "CHF": "MWST", "SEK": "Moms", "JPY": "Consumption tax"}
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]

WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

WORD_RE = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    return WORD_RE.findall(text.lower())


def approx_tokens(text: str) -> float:
    """A pessimistic token count: digits and punctuation are about one token each."""
    lower = sum(c.islower() for c in text)
    upper = sum(c.isupper() for c in text)
    digits = sum(c.isdigit() for c in text)
    spaces = len(re.findall(r"\s+", text))
    punct = len(text) - lower - upper - digits - sum(c.isspace() for c in text)
    return 0.25 * lower + 0.7 * upper + 1.0 * digits + 1.0 * punct + 0.6 * spaces


# --------------------------------------------------------------------------- formatting


def fmt_num(value: float, style: str, decimals: int = 2) -> str:
    """1234.5 -> '1,234.50' (us), '1.234,50' (eu), "1'234.50" (ch), '1 234,50' (se), '1234.50' (raw)."""
    s = f"{value:,.{decimals}f}"
    if style == "us":
        return s
    if style == "raw":
        return s.replace(",", "")
    if style == "eu":
        return s.replace(",", "_").replace(".", ",").replace("_", ".")
    if style == "ch":
        return s.replace(",", "'")
    if style == "se":
        return s.replace(",", " ").replace(".", ",")
    raise ValueError(style)


# Money styles per currency: (template, number style); {n} is the formatted number.
MONEY_STYLES = {
    "USD": [("${n}", "us"), ("${n}", "us"), ("USD {n}", "us"), ("{n} USD", "us"), ("US${n}", "us"),
            ("${n}", "raw")],
    "EUR": [("€{n}", "us"), ("EUR {n}", "us"), ("{n} €", "eu"), ("{n} EUR", "eu"), ("€ {n}", "eu")],
    "GBP": [("£{n}", "us"), ("£{n}", "us"), ("GBP {n}", "us"), ("{n} GBP", "us")],
    "CAD": [("CA${n}", "us"), ("CAD {n}", "us"), ("C${n}", "us"), ("{n} CAD", "us")],
    "AUD": [("A${n}", "us"), ("AUD {n}", "us"), ("AU${n}", "us")],
    "CHF": [("CHF {n}", "ch"), ("CHF {n}", "us"), ("{n} CHF", "us")],
    "SEK": [("SEK {n}", "se"), ("{n} SEK", "se"), ("SEK {n}", "us")],
    "JPY": [("¥{n}", "us"), ("JPY {n}", "us"), ("{n} JPY", "us")],
}


def _ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


DATE_STYLES = ["long", "short_month", "dmy_words", "dmy_short", "iso", "numeric", "ordinal",
               "dash_mon", "weekday"]


def fmt_date(d: dt.date, style: str, currency: str) -> str:
    mon = MONTHS[d.month - 1]
    if style == "numeric" and d.day <= 12:
        style = "dmy_short"  # 03/04/2025 would be ambiguous; only unambiguous numeric dates
    if style == "long":
        return f"{mon} {d.day}, {d.year}"
    if style == "short_month":
        return f"{mon[:3]} {d.day}, {d.year}"
    if style == "dmy_words":
        return f"{d.day} {mon} {d.year}"
    if style == "dmy_short":
        return f"{d.day} {mon[:3]} {d.year}"
    if style == "iso":
        return d.isoformat()
    if style == "numeric":
        if currency in ("USD", "CAD"):
            return f"{d.month:02d}/{d.day:02d}/{d.year}"
        if currency in ("EUR", "CHF", "SEK"):
            return f"{d.day:02d}.{d.month:02d}.{d.year}"
        if currency == "JPY":
            return f"{d.year}/{d.month:02d}/{d.day:02d}"
        return f"{d.day:02d}/{d.month:02d}/{d.year}"
    if style == "ordinal":
        return f"{_ordinal(d.day)} {mon} {d.year}"
    if style == "dash_mon":
        return f"{d.day:02d}-{mon[:3]}-{d.year}"
    if style == "weekday":
        return f"{WEEKDAYS[d.weekday()]}, {mon} {d.day}, {d.year}"
    raise ValueError(style)


# --------------------------------------------------------------------------- one invoice


class Invoice:
    """The facts of one invoice plus helpers that render them in the document's own style."""

    def __init__(self, rng: random.Random, vendor: str, currency: str) -> None:
        self.rng = rng
        self.vendor = vendor
        self.currency = currency
        self.client = rng.choice(CLIENTS)
        self.person = rng.choice(PEOPLE)
        self.contact = rng.choice([p for p in PEOPLE if p != self.person])
        self.phone = PHONES[currency](rng)
        self.address = f"{rng.randint(2, 980)} {rng.choice(STREETS)}, {rng.choice(CITIES[currency])}"
        start = dt.date(2024, 1, 1)
        self.date = start + dt.timedelta(days=rng.randint(0, 700))
        self.number = self._invoice_number()
        self.order_date = self.date - dt.timedelta(days=rng.randint(2, 30))
        self.due = self.date + dt.timedelta(days=rng.choice([7, 14, 15, 21, 30, 30, 45, 60]))
        self.has_due = rng.random() < 0.55
        self.po = self._po_number()
        self.has_po = rng.random() < 0.5
        self.customer_id = rng.choice(["C-", "CUST-", "", "K"]) + str(rng.randint(1000, 99999))
        self.order_no = str(rng.randint(10000, 999999))

        scale = 100 if currency == "JPY" else 1
        n_items = rng.choice([1, 1, 2, 2, 3])
        self.items = []
        for item in rng.sample(ITEMS, n_items):
            qty = rng.choice([1, 1, 1, 2, 3, 5, 10, 12])
            unit = rng.choice([rng.randint(3, 90), rng.randint(40, 400), rng.randint(200, 2500)])
            unit = float(unit * scale) if currency == "JPY" else unit + rng.choice([0, 0, 0.5, 0.99, 0.25])
            self.items.append((item, qty, unit, round(qty * unit, 2)))
        self.subtotal = round(sum(i[3] for i in self.items), 2)
        self.shipping = 0.0
        if rng.random() < 0.2:
            self.shipping = float(rng.choice([5, 9.95, 12.5, 15, 25])) * scale
        self.net = round(self.subtotal + self.shipping, 2)  # before tax
        self.tax_rate = rng.choice(TAX_RATES[currency])
        self.tax = round(self.net * self.tax_rate, 0 if currency == "JPY" else 2)
        self.total = round(self.net + self.tax, 2)

        self.items_shown: str | None = None  # the style item_lines() rendered them in, if any

        money_tpl, num_style = rng.choice(MONEY_STYLES[currency])
        self.money_tpl, self.num_style = money_tpl, num_style
        self.date_style = rng.choice(DATE_STYLES)

    def _invoice_number(self) -> str:
        r = self.rng
        initials = "".join(w[0] for w in self.vendor.replace("&", "").split()[:2]).upper()
        year = self.date.year
        return r.choice([
            f"INV-{year}-{r.randint(1, 9999):04d}", str(r.randint(10000, 99999)), f"A-{r.randint(100, 9999)}",
            f"{year}/{r.randint(1, 999):03d}", f"F{r.randint(1, 999999):06d}", f"SI-{r.randint(10000, 99999)}",
            f"{initials}-{r.randint(1000, 99999)}", f"INV{r.randint(1000, 999999)}", f"{initials}{year % 100}{r.randint(100, 999)}",
        ])

    def _po_number(self) -> str:
        r = self.rng
        return r.choice([
            f"PO-{r.randint(10000, 99999)}", f"45{r.randint(10000000, 99999999)}", f"PO{r.randint(2024, 2025)}-{r.randint(1, 999):03d}",
            f"P{r.randint(100000, 999999)}", f"PO-{r.choice(['MKT', 'IT', 'OPS', 'FIN'])}-{r.randint(100, 9999)}",
        ])

    def money(self, value: float) -> str:
        decimals = 0 if self.currency == "JPY" else 2
        return self.money_tpl.format(n=fmt_num(value, self.num_style, decimals))

    def num(self, value: float) -> str:
        """A bare number in the document's style (for layouts that state the currency once)."""
        return fmt_num(value, self.num_style, 0 if self.currency == "JPY" else 2)

    def d(self, date: dt.date) -> str:
        return fmt_date(date, self.date_style, self.currency)

    def target(self) -> dict:
        total: float | int = self.total
        if total == int(total):
            total = int(total)
        return {
            "vendor": self.vendor,
            "invoice_number": self.number,
            "date": self.date.isoformat(),
            "total": total,
            "currency": self.currency,
            "due_date": self.due.isoformat() if self.has_due else None,
            "po_number": self.po if self.has_po else None,
            "line_items": self._line_items(),
        }

    def _line_items(self) -> list[dict] | None:
        """The items, for layouts that list them (null otherwise); a receipt's caps lines show
        no quantity. Shipping is a charge, not an item."""
        if self.items_shown is None:
            return None
        out = []
        for name, qty, _unit, amount in self.items:
            out.append({
                "description": name,
                "quantity": None if self.items_shown == "caps" else qty,
                "amount": int(amount) if amount == int(amount) else amount,
            })
        return out

    def item_lines(self, style: str = "plain") -> list[str]:
        self.items_shown = style
        out = []
        for name, qty, unit, amount in self.items:
            if style == "plain":
                out.append(f"{name:<26} {qty:>3} x {self.num(unit):>9}  {self.num(amount):>10}")
            elif style == "pipe":
                out.append(f"| {name} | {qty} | {self.num(unit)} | {self.num(amount)} |")
            else:
                out.append(f"{name.upper()}  {self.num(amount)}")
        if self.shipping:
            label = {"plain": "Shipping", "pipe": "| Shipping | | |", "caps": "DELIVERY"}[style]
            end = " |" if style == "pipe" else ""
            out.append(f"{label} {self.num(self.shipping)}{end}")
        return out

    def tax_label(self) -> str:
        return f"{TAX_NAMES[self.currency]} ({self.tax_rate * 100:g}%)"


# --------------------------------------------------------------------------- layouts
# Each layout renders an Invoice as text. All of them mention the vendor, the invoice number,
# the invoice date and the total; due date and PO number only when the invoice has them.


def lay_classic(v: Invoice, r: random.Random) -> str:
    lines = [v.vendor, v.address, f"Tel: {v.phone}", "", r.choice(["INVOICE", "Tax Invoice", "Invoice"])]
    lines.append(f"{r.choice(['Invoice No:', 'Invoice #:', 'Invoice number:'])} {v.number}")
    lines.append(f"{r.choice(['Invoice Date:', 'Date:', 'Date of issue:'])} {v.d(v.date)}")
    if v.has_due:
        lines.append(f"{r.choice(['Due Date:', 'Payment due:', 'Due:'])} {v.d(v.due)}")
    if v.has_po:
        lines.append(f"{r.choice(['PO Number:', 'Your PO:', 'P.O. #:'])} {v.po}")
    lines.append(f"Bill to: {v.client}")
    lines += v.item_lines("plain")
    lines.append(f"Subtotal: {v.money(v.net)}")
    if v.tax:
        lines.append(f"{v.tax_label()}: {v.money(v.tax)}")
    lines.append(f"{r.choice(['Total due:', 'TOTAL:', 'Amount due:', 'Total:'])} {v.money(v.total)}")
    return "\n".join(lines)


def lay_email(v: Invoice, r: random.Random) -> str:
    subj = r.choice([f"Invoice {v.number} from {v.vendor}", f"Your invoice {v.number}",
                     f"{v.vendor} - invoice {v.number}", f"New invoice available ({v.number})"])
    first = v.contact.split()[0]
    body = [f"Subject: {subj}", "", f"{r.choice(['Hi', 'Hello', 'Dear', 'Good morning'])} {first},", ""]
    date, total = v.d(v.date), v.money(v.total)
    sent = r.choice([
        f"Please find attached invoice {v.number} dated {date} for {total}",
        f"Attached is our invoice {v.number} for {total}, issued on {date}",
        f"Thank you for your business. Invoice {v.number} for the amount of {total} was issued on {date}",
        f"As discussed, here is invoice {v.number} ({date}) covering last month's work, total {total}",
    ])
    if v.has_po:
        sent += r.choice([f", referencing your purchase order {v.po}", f" (your PO: {v.po})"])
    body.append(sent + ".")
    if v.has_due:
        body.append(r.choice([f"Payment is due by {v.d(v.due)}.", f"Kindly settle it before {v.d(v.due)}.",
                              f"The due date is {v.d(v.due)}."]))
    else:
        body.append(r.choice(["Thank you for your prompt payment.", "Let me know if you have any questions.",
                              "The amount will be charged to the card on file."]))
    body.append(r.choice([f"You can reach me on {v.phone} if anything is unclear.",
                          f"Our accounts team is available on {v.phone}.",
                          f"Your customer number with us is {v.customer_id}."]))
    body += ["", r.choice(["Best regards,", "Kind regards,", "Thanks,", "Many thanks,"]), v.person,
             r.choice([v.vendor, f"Accounts, {v.vendor}", f"{v.vendor} | {v.phone}"])]
    return "\n".join(body)


def lay_receipt(v: Invoice, r: random.Random) -> str:
    v.has_due = v.has_due and r.random() < 0.3  # most receipts are paid on the spot
    lines = [v.vendor.upper(), v.address.upper(), f"TEL {v.phone}"]
    lines.append(f"{r.choice(['RECEIPT #', 'RCPT NO.', 'INVOICE NO'])} {v.number}")
    lines.append(f"{r.choice(['DATE', 'DATE:', 'DT'])} {v.d(v.date).upper()}  {r.randint(7, 20):02d}:{r.randint(0, 59):02d}")
    lines += v.item_lines("caps")
    lines.append(f"SUBTOTAL   {v.num(v.net)}")
    if v.tax:
        lines.append(f"{TAX_NAMES[v.currency].upper()} {v.tax_rate * 100:g}%   {v.num(v.tax)}")
    lines.append(f"TOTAL {v.currency}   {v.num(v.total)}")
    if v.has_po:
        lines.append(f"PO REF {v.po}")
    if v.has_due:
        lines.append(f"PAYABLE BY {v.d(v.due).upper()}")
    lines.append(r.choice([f"CARD ****{r.randint(1000, 9999)}", "THANK YOU FOR YOUR VISIT", "*** CUSTOMER COPY ***"]))
    return "\n".join(lines)


def lay_note(v: Invoice, r: random.Random) -> str:
    date, total = v.d(v.date), v.money(v.total)
    parts = [r.choice([
        f"Got the {v.vendor} invoice, no. {v.number}, {total}, dated {date}.",
        f"{v.vendor} sent invoice {v.number} ({date}) for {total}.",
        f"Invoice from {v.vendor}: #{v.number}, issued {date}, total {total}.",
        f"Hey, just scanned the {v.vendor} invoice ({v.number}). It's dated {date} and comes to {total}.",
        f"Another one for the pile: {v.vendor}, invoice {v.number}, {total} (invoice date {date}).",
    ])]
    if v.has_due:
        parts.append(r.choice([f"Due {v.d(v.due)}.", f"They want it paid by {v.d(v.due)}.",
                               f"Has to be paid by {v.d(v.due)}."]))
    if v.has_po:
        parts.append(r.choice([f"PO is {v.po}.", f"Matches PO {v.po}.", f"It's against PO {v.po}."]))
    else:
        parts.append(r.choice(["No PO on it.", "", "Can you book it?", "Not sure which PO this belongs to."]))
    parts.append(r.choice([f"- {v.person.split()[0]}", "Thanks!", f"Cheers, {v.person.split()[0]}", "Sent from my phone"]))
    text = " ".join(p for p in parts[:-1] if p)
    return text + "\n" + parts[-1]


def lay_reminder(v: Invoice, r: random.Random) -> str:
    v.has_due = True  # a payment reminder always states the due date
    date, total, due = v.d(v.date), v.money(v.total), v.d(v.due)
    lines = [f"Subject: {r.choice(['Payment reminder', 'Overdue invoice', 'Friendly reminder', 'Outstanding balance'])}"
             f" - {v.number}", ""]
    lines.append(r.choice([f"Dear {v.client} team,", "Hello,", f"To the accounts team at {v.client},",
                           f"Dear {v.contact.split()[0]},"]))
    lines.append(r.choice([
        f"Our records show that invoice {v.number}, issued on {date} for {total}, was due on {due} and remains unpaid.",
        f"This is a reminder that payment of {total} for invoice {v.number} (dated {date}) was due on {due}.",
        f"We have not yet received payment for invoice {v.number} of {date}. The outstanding amount of {total} was due {due}.",
        f"Invoice {v.number} ({date}, {total}) is now past its due date of {due}.",
    ]))
    if v.has_po:
        lines.append(r.choice([f"The invoice relates to your PO {v.po}.", f"Your purchase order: {v.po}."]))
    lines.append(r.choice([
        f"If you have already paid, please ignore this message. Questions? Call {v.phone}.",
        f"Please arrange payment at your earliest convenience. Customer ID: {v.customer_id}.",
        f"A late fee may apply after 30 days. Your account number is {v.customer_id}.",
    ]))
    lines += ["", r.choice([f"{v.vendor} - Accounts Receivable", f"{v.person}, {v.vendor}", f"Credit control, {v.vendor}"])]
    return "\n".join(lines)


def lay_table(v: Invoice, r: random.Random) -> str:
    lines = [f"{v.vendor} | Invoice {v.number}", f"Issued: {v.d(v.date)}"
             + (f" | Due: {v.d(v.due)}" if v.has_due else "")]
    if v.has_po:
        lines.append(f"Purchase order: {v.po}")
    lines.append(f"Currency: {v.currency}")
    lines.append("| Description | Qty | Unit | Amount |")
    lines += v.item_lines("pipe")
    lines.append(f"| Subtotal | | | {v.num(v.net)} |")
    if v.tax:
        lines.append(f"| {v.tax_label()} | | | {v.num(v.tax)} |")
    lines.append(f"| **Total** | | | **{v.num(v.total)}** |")
    return "\n".join(lines)


def lay_keyvalue(v: Invoice, r: random.Random) -> str:
    rows = [("Supplier", v.vendor), ("Invoice #", v.number), ("Invoice date", v.d(v.date)),
            ("Order date", v.d(v.order_date)), ("Customer no.", v.customer_id)]
    if v.has_due:
        rows.append(("Due date", v.d(v.due)))
    if v.has_po:
        rows.append(("PO", v.po))
    elif r.random() < 0.5:
        rows.append(("PO", r.choice(["n/a", "-", "none"])))
    rows.append(("Net", v.money(v.net)))
    rows.append(("Amount payable", v.money(v.total)))
    head, tail = rows[:2], rows[2:]
    r.shuffle(tail)
    sep = r.choice([": ", " = ", " - "])
    return "\n".join(f"{k}{sep}{val}" for k, val in head + tail)


def lay_freelance(v: Invoice, r: random.Random) -> str:
    hours = r.randint(3, 60)
    lines = [f"INVOICE {v.number}", f"From: {v.person}, {v.vendor}", f"To: {v.client}",
             f"Date: {v.d(v.date)}"]
    lines.append(f"Work period: {v.d(v.order_date)} to {v.d(v.date - dt.timedelta(days=1))}")
    lines.append(f"{hours} hours of {r.choice(['design work', 'consulting', 'development', 'copywriting'])}, see timesheet")
    if v.tax:
        lines.append(f"Net {v.money(v.net)} + {v.tax_label()} {v.money(v.tax)}")
    lines.append(f"Please pay {v.money(v.total)}" + (f" by {v.d(v.due)}" if v.has_due else "") + ".")
    if v.has_po:
        lines.append(f"Client PO: {v.po}")
    lines.append(f"Bank: IBAN ending {r.randint(1000, 9999)}")
    return "\n".join(lines)


def lay_utility(v: Invoice, r: random.Random) -> str:
    acct = f"{r.randint(1000, 9999)}-{r.randint(100000, 999999)}"
    lines = [f"{v.vendor} - {r.choice(['Monthly statement', 'Your bill', 'Service invoice'])}",
             f"Account number: {acct}", f"Bill number: {v.number}", f"Statement date: {v.d(v.date)}",
             f"Service period: {v.d(v.order_date)} - {v.d(v.date)}"]
    lines.append(f"Previous balance: {v.money(0)}   Payments received: {v.money(0)}")
    lines.append(f"New charges: {v.money(v.net)}")
    if v.tax:
        lines.append(f"Taxes: {v.money(v.tax)}")
    lines.append(f"Amount due: {v.money(v.total)}")
    if v.has_due:
        lines.append(f"Please pay by {v.d(v.due)}")
    if v.has_po:
        lines.append(f"Customer reference (PO): {v.po}")
    lines.append(f"Customer service: {v.phone}")
    return "\n".join(lines)


def lay_forward(v: Invoice, r: random.Random) -> str:
    lines = [r.choice(["Forwarding this one for approval.", "FYI, see below.", "Can someone pay this?"]), "",
             "---------- Forwarded message ---------", f"From: billing@{_slug(v.vendor)}.example",
             f"Date: {v.d(v.date + dt.timedelta(days=r.randint(0, 3)))}",
             f"Subject: {v.vendor} invoice {v.number}", ""]
    text = f"Invoice {v.number} for your order {v.order_no} (placed {v.d(v.order_date)}) is attached. "
    text += f"Invoice date: {v.d(v.date)}. Amount: {v.money(v.total)}."
    if v.has_due:
        text += f" Due date: {v.d(v.due)}."
    if v.has_po:
        text += f" PO reference: {v.po}."
    lines.append(text)
    return "\n".join(lines)


def lay_european(v: Invoice, r: random.Random) -> str:
    lines = [f"{v.vendor}", v.address, f"VAT ID: {r.choice(['DE', 'NL', 'FR', 'IT'])}{r.randint(100000000, 999999999)}",
             f"Invoice no.: {v.number}", f"Invoice date: {v.d(v.date)}",
             f"Delivery date: {v.d(v.order_date)}"]
    if v.has_po:
        lines.append(f"Your order ref.: {v.po}")
    lines.append(f"Net amount: {v.money(v.net)}")
    lines.append(f"{v.tax_label()}: {v.money(v.tax)}")
    lines.append(f"Gross total: {v.money(v.total)}")
    if v.has_due:
        lines.append(f"Payable without deduction by {v.d(v.due)}.")
    else:
        lines.append("Payable immediately without deduction.")
    return "\n".join(lines)


def lay_oneline(v: Invoice, r: random.Random) -> str:
    bits = [v.vendor, f"inv {v.number}", v.d(v.date), v.money(v.total)]
    if v.has_due:
        bits.append(f"due {v.d(v.due)}")
    if v.has_po:
        bits.append(f"PO {v.po}")
    sep = r.choice([" | ", " - ", "; "])
    head = r.choice(["Expense export:", "Bill:", "AP queue:", "New bill received"])
    return head + "\n" + sep.join(bits)


def lay_approval(v: Invoice, r: random.Random) -> str:
    received = v.d(v.date + dt.timedelta(days=r.randint(1, 6)))
    date, total = v.d(v.date), v.money(v.total)
    po = f" (PO {v.po})" if v.has_po else ""
    text = r.choice([
        f"Please approve: {v.vendor} invoice {v.number} for {total}{po}. Invoice dated {date}, received {received}.",
        f"Approval needed for {v.vendor} invoice {v.number}{po} - {total}. Dated {date}, landed in our inbox {received}.",
        f"Can you sign off on the {v.vendor} bill? Invoice {v.number}, {total}, issued {date}{po}.",
    ])
    if v.has_due:
        text += r.choice([f" Payment due {v.d(v.due)}.", f" Needs to go out before {v.d(v.due)}."])
    extra = r.choice([f"Budget code {r.randint(100, 999)}-{r.randint(10, 99)}.",
                      f"Net of tax it was {v.money(v.net)}.", "", f"Ext. {r.randint(100, 999)}"])
    return f"{text} {extra}".strip() + f"\n{v.person}, {r.choice(['Finance', 'Accounts Payable', 'Office Manager'])}"


def lay_sms(v: Invoice, r: random.Random) -> str:
    date, total = v.d(v.date), v.money(v.total)
    text = r.choice([
        f"{v.vendor}: your invoice {v.number} of {total} dated {date} is ready.",
        f"Hi from {v.vendor}! Invoice {v.number} ({date}) for {total} has been issued.",
        f"{v.vendor} billing: new invoice {v.number}, amount {total}, date {date}.",
    ])
    if v.has_due:
        text += r.choice([f" Please pay by {v.d(v.due)}.", f" Due {v.d(v.due)}."])
    if v.has_po:
        text += f" Ref PO {v.po}."
    text += "\n" + r.choice([f"Questions? {v.phone}. Reply STOP to opt out.", f"Help: {v.phone}",
                              f"Pay online with customer no. {v.customer_id}."])
    return text


def _slug(name: str) -> str:
    return re.sub(r"[^a-z]+", "", name.lower().split()[0])


LAYOUTS: list[tuple[str, Callable[[Invoice, random.Random], str]]] = [
    ("classic", lay_classic), ("email", lay_email), ("receipt", lay_receipt), ("note", lay_note),
    ("reminder", lay_reminder), ("table", lay_table), ("keyvalue", lay_keyvalue),
    ("freelance", lay_freelance), ("utility", lay_utility), ("forward", lay_forward),
    ("european", lay_european), ("oneline", lay_oneline), ("approval", lay_approval), ("sms", lay_sms),
]


def make_vendor(rng: random.Random) -> tuple[str, str]:
    stem = rng.choice(VENDOR_STEMS)
    suffix, home = rng.choice(VENDOR_KINDS)
    if home is None:
        currencies = list(CURRENCY_WEIGHTS)
        home = rng.choices(currencies, weights=[CURRENCY_WEIGHTS[c] for c in currencies])[0]
    return f"{stem} {suffix}", home


def jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def generate(seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    plan = [LAYOUTS[i % len(LAYOUTS)] for i in range(N_INVOICES)]
    rng.shuffle(plan)
    seen: set[str] = set()
    accepted: list[frozenset] = []
    rows = []
    for name, layout in plan:
        for _attempt in range(500):
            vendor, currency = make_vendor(rng)
            inv = Invoice(rng, vendor, currency)
            if name == "european" and currency not in ("EUR", "CHF", "SEK"):
                continue
            text = layout(inv, rng)
            norm = " ".join(words(text))
            if norm in seen or len(text.split()) > MAX_WORDS or approx_tokens(text) > MAX_TEXT_TOKENS:
                continue
            ws = frozenset(words(text))
            if any(jaccard(ws, other) >= MAX_JACCARD for other in accepted):
                continue
            break
        else:
            raise RuntimeError(f"could not make a new {name} invoice")
        seen.add(norm)
        accepted.append(ws)
        rows.append({"text": text, "target": inv.target(), "_layout": name})
    return [
        {"id": f"inv{i:04d}", "text": r["text"], "target": r["target"], "_layout": r["_layout"]}
        for i, r in enumerate(rows, start=1)
    ]


def write(rows: list[dict], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FILENAME
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            obj = {"id": r["id"], "text": r["text"], "target": r["target"]}
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
    return path


def _percentile(sorted_values: list[int], q: float) -> int:
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def stats(rows: list[dict]) -> str:
    n = len(rows)
    lines = [f"invoices: {n}", "", "field presence (non-null):"]
    for key in KEYS:
        k = sum(r["target"].get(key) is not None for r in rows)
        lines.append(f"  {key:<15} {k:>4} ({100 * k / n:.0f}%)")
    lines += ["", "currency:"]
    cur: dict[str, int] = {}
    for r in rows:
        cur[r["target"]["currency"]] = cur.get(r["target"]["currency"], 0) + 1
    lines.append("  " + "  ".join(f"{c} {k}" for c, k in sorted(cur.items(), key=lambda x: (-x[1], x[0]))))
    lines += ["", "layout:"]
    lay: dict[str, int] = {}
    for r in rows:
        lay[r["_layout"]] = lay.get(r["_layout"], 0) + 1
    lines.append("  " + "  ".join(f"{name} {k}" for name, k in lay.items()))
    n_words = sorted(len(r["text"].split()) for r in rows)
    n_lines = sorted(len(r["text"].splitlines()) for r in rows)
    mean = sum(n_words) / n
    lines += [
        "",
        "length in words (whitespace-separated):",
        f"  min {n_words[0]}  p10 {_percentile(n_words, 0.1)}  p25 {_percentile(n_words, 0.25)}"
        f"  median {_percentile(n_words, 0.5)}  p75 {_percentile(n_words, 0.75)}"
        f"  p90 {_percentile(n_words, 0.9)}  max {n_words[-1]}  mean {mean:.1f}",
    ]
    for lo, hi in [(1, 20), (21, 40), (41, 60), (61, 80), (81, 150)]:
        k = sum(lo <= w <= hi for w in n_words)
        lines.append(f"  {lo:>3}-{hi:<3} words: {k:>4}  {'#' * round(60 * k / n)}")
    lines.append(f"lines per text: min {n_lines[0]}  median {_percentile(n_lines, 0.5)}  max {n_lines[-1]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data",
                        help=f"folder to write {FILENAME} into (default: data/ beside this script)")
    parser.add_argument("--seed", type=int, default=SEED, help=f"random seed (default {SEED})")
    parser.add_argument("--stats", action="store_true", help="print counts and length distribution")
    args = parser.parse_args(argv)
    rows = generate(args.seed)
    path = write(rows, args.out)
    print(f"wrote {len(rows)} invoices to {path}")
    if args.stats:
        print(stats(rows))


if __name__ == "__main__":
    main()
