"""A fast, dependency-free extractor: capitalised spans, quoted titles, dates and numbers.

:class:`HeuristicExtractor` needs nothing beyond the standard library and runs in well under a
millisecond per question. What it recognises:

* **entities**: runs of capitalised words (``Sturla Gunnarsson``, ``EXOSAT``), joined across
  connector words (``of``, ``the``, ``de``, ``von``, ``&``, ...) when a capitalised word
  follows (``Battle of Cold Harbor``, ``Beowulf & Grendel``, ``Mystery Of The 13th Guest``),
  with numbers inside a capitalised run (``22nd AVN Awards``, ``8 Spruce Street``), and
  quoted titles (``"Switched at Birth"``). A name is returned in the casing names are
  written in, as QuCo-RAG's authors' extraction prompt returns it (its examples 1, 3, 4):
  a Title-Cased question's small words inside a name are lower-cased (``Mystery Of The 13Th
  Guest`` -> ``Mystery of the 13th Guest``), so the name counts in a cased index. ``X and
  Y`` stays one entity when both sides are single capitalised words and nothing says it is
  a list (``Tom and Jerry``, ``Car and Driver``; but ``both Ugni and Stenomesson`` gives
  two). Entities may contain the words
  "and"/"or": they are plain strings, never query operators. Question words, sentence openers,
  months, weekdays and nationality words (``American``, ``Italian-American``) are not
  entities; a sentence-initial ``The`` is dropped. In a question (``entities``), as the
  authors' prompt chooses: a disambiguator stays in the name as written (``Polish-Russian
  War (Film)``), a possessive followed by a capitalised word stays inside it (``Canfield's
  Diet Chocolate Fudge``), only the listed names count after "the following ...:", and a
  parenthesised aside counts only when nothing outside it is named;
* **claims**: the head is the first entity of the sentence; every later entity, date, number
  or nationality word is a tail; the relation is the words between the previous mention and
  the tail, without auxiliaries and articles, at most four words (``was directed by`` ->
  ``directed by``). A possessive sets the relation (``Coulson Wallop's father, Nigel Wallop,``
  -> ``(Coulson Wallop, father, Nigel Wallop)``) and an apposition after it becomes the head of
  what follows. Sentences that open with "Thus", "Therefore", "So", "Hence", ... give ``[]``;
  a question gives partial claims ``(entity, relation)``.

Known limits: no coreference ("He was born in 1950." has no head, so the first entity is the
head); lower-case entities ("iPhone") and unquoted titles made of common words are missed.

Empty or whitespace-only text gives ``[]`` (extractors never raise on odd text; validate a
question before gating it); a non-string raises TypeError.

Example:
    >>> ex = HeuristicExtractor()
    >>> ex.entities("Which film came out first, Kumbasaram or Mystery Of The 13Th Guest?")
    ['Kumbasaram', 'Mystery of the 13th Guest']
    >>> ex.claims("Beowulf & Grendel was directed by Sturla Gunnarsson.")[0].relation
    'directed by'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from rag_gates.extract.base import BaseExtractor, Claim, unique_claims, unique_names

__all__ = ["HeuristicExtractor", "factual_text", "is_non_factual"]



def _wordset(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Capitalised words that never start an entity (lower-cased).
_STOP = _wordset("""
which what who whom whose when where why how is are was were be been being do does did has have
had can could will would shall should may might must the a an this that these those both
between of for from by with as it he she they we i you his her its their our my your in on at
to into onto after before during since until thus therefore so hence consequently also if
and or but not no yes name give list find although though however while whereas because
there here then than one some any each either neither all many much more most other another
such same according like per via about over under among within without against upon
yes no answer question let lets note first then finally meanwhile
aside despite besides apart unlike following including excluding other others
""")
# Months and weekdays: dates, not entities.
_DATE_WORDS = _wordset("january february march april may june july august september october "
                       "november december monday tuesday wednesday thursday friday saturday "
                       "sunday")
# Nationality words: tails of claims ("is an American actress"), never question entities.
_DEMONYMS = _wordset("""
american british english french german italian spanish portuguese dutch belgian swiss austrian
irish scottish welsh canadian australian mexican brazilian argentine argentinian chilean
colombian peruvian cuban russian soviet polish czech slovak hungarian romanian bulgarian greek
turkish swedish norwegian danish finnish icelandic japanese chinese korean indian pakistani
bangladeshi iranian persian iraqi israeli egyptian nigerian kenyan african european asian
latin hispanic arab arabic jewish christian catholic muslim hindu buddhist roman byzantine
ukrainian serbian croatian bosnian slovenian lithuanian latvian estonian filipino thai
vietnamese indonesian malaysian singaporean taiwanese tibetan mongolian nepali nepalese sri
lankan new zealand zealander south north east west western eastern northern southern
british-american anglo
""")
# Lower-case words that may sit inside an entity between capitalised words.
_CONNECTORS = _wordset("of the de da di del della des du la le van von der den y al bin ibn upon")
# Capitalised articles that may open a title mid-sentence ("in The Dinner Party").
_TITLE_ARTICLES = frozenset({"The", "A", "An"})
# Abbreviations whose period may sit inside a name ("Ken St. Andre").
_NAME_ABBREVIATIONS = _wordset("St Mt Ft Dr Mr Mrs Ms Jr Sr Prof Gen Lt Col Capt Rev Sen Gov "
                               "Pres Sgt Adm Hon Fr")
# Words that end the noun phrase after a possessive: prepositions and common verbs.
_RELATION_STOP = _wordset("""
from in at of on to for by with as into about graduate play born die live work study attend
write direct found star win marry become serve belong come go locate release publish produce
perform join leave teach record create design build own lead make get run sing appear
""")
_NON_FACTUAL = re.compile(
    r"^\W*(thus|therefore|so|hence|consequently|accordingly|in conclusion|as a result|"
    r"in summary|overall|the answer is|so the answer is)\b",
    re.IGNORECASE,
)
_AUX = _wordset("is are was were be been being has have had do does did will would can could "
                "shall should may might must also a an the its his her their and or but "
                "which who that")

_TOKEN = re.compile(
    r"""
    (?P<quote>"[^"\n]{1,120}"|“[^”\n]{1,120}”)             # a quoted title
    | (?P<word>[^\W_](?:[\w'’.\-–]*[^\W_])?)               # a word (U.S, F.C, 13th, O'Neil)
    | (?P<amp>&)
    | (?P<punct>[^\w\s])
    """,
    re.VERBOSE,
)
_ORDINAL = re.compile(r"^\d+(?:st|nd|rd|th)$")
# Titles that make an apposition part of a name ("Thomas Fane, 8th Earl of Westmorland").
_NOBLE_TITLES = _wordset("""
Baron Baroness Baronet Earl Duke Duchess Prince Princess Count Countess Viscount Viscountess
Marquess Marquis Marchioness Lord Lady King Queen Emperor Empress Margrave Landgrave Elector
""")
_NUMBER = re.compile(r"^\d[\d,.]*(?:st|nd|rd|th|s)?$", re.IGNORECASE)
_YEAR = re.compile(r"^(1[0-9]{3}|20[0-9]{2})s?$")
_POSSESSIVE = re.compile(r"^(.+?)(?:'s|’s|')$")
# Small words a Title-Cased question capitalises inside a name ("Mystery Of The 13Th Guest",
# "Prince Boris Of Leiningen") and the name itself writes in lower case. QuCo's authors'
# extraction prompt restores them ("Mystery of the 13th Guest", "John V, Prince of
# Anhalt-Zerbst", "The Mask of Fu Manchu": examples 1, 3, 4 of
# ``entity_extraction_prompt_for_question``) and counts the result as written in a cased
# index, so a Title-Cased entity would count 0. English articles, conjunctions and short
# prepositions only: "De", "Van", "La" stay as written ("Robert De Niro", "Lana Del Rey").
_SMALL_WORDS = _wordset("of the a an and or nor at by for from in into on onto to with upon")
# "13Th" -> "13th"; "Mother'S" / "Don'T" -> "Mother's" / "Don't" (2Wiki's Title Case).
_TITLE_ORDINAL = re.compile(r"^(\d+)(St|Nd|Rd|Th)$")
_TITLE_CONTRACTION = re.compile(r"(?<=\w)(['’])(S|T|Re|Ll|Ve|D|M)$")
# "Amadeus Vii" -> "Amadeus VII": a regnal number Title-Cased (I, V and X only, two letters
# or more, never a name's first word; not "Xi", a common Chinese name).
_TITLE_ROMAN = re.compile(r"^(?!Xi$)(?=[IVX][ivx]+$)(?i:x{0,3}(?:ix|iv|v?i{0,3}))$")

Kind = Literal["entity", "date", "number", "nationality"]


@dataclass
class _Tok:
    text: str
    start: int
    end: int
    kind: str  # "word" | "quote" | "amp" | "punct"
    possessive: bool = False


@dataclass
class _Mention:
    text: str
    first: int  # token index range [first, last]
    last: int
    kind: Kind
    possessive: bool = False


def is_non_factual(sentence: str) -> bool:
    """True for reasoning conclusions ("Thus, ...", "Therefore ...", "So the answer is ...")."""
    return bool(_NON_FACTUAL.match(sentence))


def factual_text(sentence: str) -> str | None:
    """``sentence`` stripped, for an extractor's ``claims`` to read; None when it is empty or
    a reasoning conclusion (no claims); TypeError for anything but a str."""
    if not isinstance(sentence, str):
        raise TypeError(f"sentence must be a str, got {type(sentence).__name__}")
    text = sentence.strip()
    return None if not text or is_non_factual(text) else text


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup or "punct"
        value = m.group()
        if kind == "word":
            poss = _POSSESSIVE.match(value)
            # "Wallop's" -> Wallop + possessive; "Peries'" too; O'Neil stays whole.
            if poss and value.endswith(("'s", "’s", "'", "’")):
                stem = poss.group(1)
                out.append(_Tok(stem, m.start(), m.start() + len(stem), kind, True))
                continue
        out.append(_Tok(value, m.start(), m.end(), kind))
    return out


def _is_cap(tok: _Tok) -> bool:
    """Capitalised ("Wallop", "EXOSAT") or a digit-led code with a capital ("9R", "3D")."""
    t = tok.text
    return tok.kind == "word" and (t[0].isupper() or (t[0].isdigit() and any(
        c.isupper() for c in t) and not _NUMBER.match(t)))


def _is_num(tok: _Tok) -> bool:
    return tok.kind == "word" and bool(_NUMBER.match(tok.text))


def _name_case(text: str, toks: list[_Tok], first: int, last: int) -> str:
    """The name spanning tokens ``first..last`` of ``text`` in the casing names are written
    in: a Title-Cased question's small words lower-cased inside the name ("Mystery Of The
    13Th Guest" -> "Mystery of the 13th Guest", "Bad Times At The El Royale" -> "Bad Times at
    the El Royale", "Mother'S Day" -> "Mother's Day", "Amadeus Vii" -> "Amadeus VII"), as
    QuCo's authors' extractor writes
    them (examples 1, 3 and 4 of their question prompt). A small word keeps its capital as
    the name's first or last word, after a colon or an opening parenthesis ("Kirby 64: The
    Crystal Shards") and as an initial ("John A. Smith"). A name already cased is unchanged.
    """
    edits: list[tuple[int, int, str]] = []
    words = [t for t in range(first, last + 1) if toks[t].kind == "word"]
    for t in words:
        tok = toks[t]
        word = tok.text
        if (t != words[0] and t != words[-1] and word.lower() in _SMALL_WORDS
                and word[0].isupper() and word[1:] == word[1:].lower()
                and toks[t - 1].text not in {":", "(", "—", "–", '"', "“"}
                and not (toks[t + 1].text == "." and toks[t + 1].start == tok.end)):
            edits.append((tok.start, tok.end, word.lower()))
            continue
        if t != words[0] and _TITLE_ROMAN.match(word):
            edits.append((tok.start, tok.end, word.upper()))
            continue
        ordinal = _TITLE_ORDINAL.match(word)
        if ordinal:
            edits.append((tok.start, tok.end, ordinal.group(1) + ordinal.group(2).lower()))
            continue
        contraction = _TITLE_CONTRACTION.search(word)
        if contraction:
            edits.append((tok.start + contraction.start(), tok.end, contraction.group().lower()))
    start, end = toks[first].start, toks[last].end
    out = text[start:end]
    for a, b, new in reversed(edits):
        out = out[:a - start] + new + out[b - start:]
    return out


class HeuristicExtractor(BaseExtractor):
    """Capitalised-span entities and positional claims, no dependencies (see module doc).

    Args:
        max_relation_words: relation words kept (the ones nearest the tail).

    Example:
        >>> HeuristicExtractor().entities("Are both Don Giovanni and Cardillac operas?")
        ['Don Giovanni', 'Cardillac']
    """

    name = "heuristic"

    def __init__(self, max_relation_words: int = 4) -> None:
        if max_relation_words < 1:
            raise ValueError(f"max_relation_words must be >= 1, got {max_relation_words}")
        self.max_relation_words = max_relation_words

    # ------------------------------------------------------------------ mentions
    def _mentions(self, text: str, question: bool = False
                  ) -> tuple[list[_Tok], list[_Mention]]:
        """Tokens and mentions of ``text``; ``question``: also join a possessive name and a
        parenthesised disambiguator into the name (:meth:`_span_end`)."""
        toks = _tokens(text)
        mentions: list[_Mention] = []
        i, n = 0, len(toks)
        while i < n:
            tok = toks[i]
            if tok.kind == "quote":
                inner = tok.text[1:-1].strip().strip(",.;:!?").strip()
                if inner and len(inner.split()) <= 12:
                    mentions.append(_Mention(inner, i, i, "entity", tok.possessive))
                i += 1
                continue
            if tok.kind != "word":
                i += 1
                continue
            low = tok.text.lower()
            if _is_num(tok) and not self._num_in_name(toks, i):
                kind: Kind = "date" if _YEAR.match(tok.text) else "number"
                mentions.append(_Mention(tok.text, i, i, kind))
                i += 1
                continue
            if low in _DATE_WORDS and tok.text[0].isupper():
                j = self._date_end(toks, i)
                mentions.append(_Mention(text[toks[i].start:toks[j].end], i, j, "date"))
                i = j + 1
                continue
            if _is_cap(tok) or (_is_num(tok) and self._num_in_name(toks, i)):
                j = self._span_end(toks, i, question)
                first = i
                # Drop leading stop words ("The" only at sentence start or before a stop word).
                while first <= j and toks[first].text.lower() in _STOP and not (
                    toks[first].text in _TITLE_ARTICLES and first > 0 and first < j
                    and toks[first + 1].text.lower() not in _STOP
                    and not self._sentence_start(toks, first)
                ):
                    first += 1
                if first <= j:
                    words = [t.text.lower() for t in toks[first:j + 1]]
                    surface = text[toks[first].start:toks[j].end]
                    if all(w in _DEMONYMS or all(p in _DEMONYMS for p in re.split(r"[-–]", w))
                           for w in words):
                        mentions.append(_Mention(surface, first, j, "nationality"))
                    elif all(w in _STOP or w in _DATE_WORDS or _NUMBER.match(w) for w in words):
                        pass
                    else:
                        mentions.append(_Mention(_name_case(text, toks, first, j), first, j,
                                                 "entity", toks[j].possessive))
                i = j + 1
                continue
            i += 1
        return toks, mentions

    @staticmethod
    def _sentence_start(toks: list[_Tok], i: int) -> bool:
        return i == 0 or toks[i - 1].text in {".", "!", "?", ":", '"', "“", "(", "—"}

    @staticmethod
    def _num_in_name(toks: list[_Tok], i: int) -> bool:
        """A number inside a capitalised run: "22nd AVN Awards", "Route 78", "13th Guest"."""
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        prv = toks[i - 1] if i > 0 else None
        nxt_cap = nxt is not None and _is_cap(nxt) and nxt.text.lower() not in _STOP \
            and nxt.text.lower() not in _DATE_WORDS
        prv_cap = prv is not None and _is_cap(prv) and prv.text.lower() not in _STOP \
            and prv.text.lower() not in _DATE_WORDS and not prv.possessive
        if prv is not None and prv.text.lower() in ("the", "of") and nxt_cap:
            return True
        return bool((nxt_cap and not _YEAR.match(toks[i].text)) or prv_cap)

    @staticmethod
    def _date_end(toks: list[_Tok], i: int) -> int:
        """Extend a month name over "16, 1966" / "1995"; return the last token index."""
        j = i
        if j + 1 < len(toks) and _is_num(toks[j + 1]):
            j += 1
            if j + 2 < len(toks) and toks[j + 1].text == "," and _YEAR.match(toks[j + 2].text):
                j += 2
        elif j > 0 and _is_num(toks[j - 1]):
            pass
        return j

    def _span_end(self, toks: list[_Tok], i: int, question: bool = False) -> int:
        """Last token index of the capitalised run starting at ``i``. In a question
        (``question``) a possessive followed by a capitalised word stays inside the name, as
        in QuCo's authors' prompt ("Canfield's Diet Chocolate Fudge", example 8 of
        ``entity_extraction_prompt_for_question``); "Anhalt-Zerbst's father" still ends it."""
        j = i
        n = len(toks)
        while not toks[j].possessive or (question and self._possessive_name(toks, j)):
            k = j + 1
            if k < n and toks[k].kind == "word" and (
                (_is_cap(toks[k]) and toks[k].text.lower() not in _DATE_WORDS)
                or (_is_num(toks[k]) and self._num_in_name(toks, k))
            ):
                j = k
                continue
            # "Ken St. Andre", "Henry J. Kaiser": an initial or title abbreviation's period.
            if (k + 1 < n and toks[k].text == "." and toks[k + 1].start == toks[k].end + 1
                    and ((len(toks[j].text) == 1 and toks[j].text.isupper())
                         or toks[j].text in _NAME_ABBREVIATIONS)
                    and _is_cap(toks[k + 1]) and toks[k + 1].text.lower() not in _STOP):
                j = k + 1
                continue
            # Connectors: up to two lower-case connector words, or "&", then a capital.
            m = k
            while m < n and m - k < 2 and (
                toks[m].kind == "amp" or toks[m].text.lower() in _CONNECTORS
                or (toks[m].text.lower() == "and" and self._joins_and(toks, i, j, m))
            ):
                m += 1
            if m > k and m < n and toks[m].kind == "word" and (
                (_is_cap(toks[m]) and toks[m].text.lower() not in _STOP)
                or (_is_num(toks[m]) and m + 1 < n and _is_cap(toks[m + 1]))
            ):
                j = m
                continue
            appended = self._appended(toks, j, question)
            if appended is None:
                break
            j = appended
        return j

    def _appended(self, toks: list[_Tok], j: int, question: bool = False) -> int | None:
        """The end of a subtitle or a title apposition that belongs to the name ending at
        ``j`` ("Tron: Legacy", "John V, Prince of Anhalt-Zerbst", "Thomas Fane, 8th Earl of
        Westmorland", "Harvey Peltier, Sr."), or None. QuCo's authors extract such subjects
        whole (their extractor prompt's example 4), and a split subject is counted as two
        unrelated, commoner words. A colon followed by a list is not a subtitle ("formed in
        California: Dig and Thinking Fellers ..."). In a question, a parenthesised
        disambiguator after the name belongs to it as written ("Polish-Russian War (Film)",
        the authors' example 2; "Marius (1931 Film)")."""
        n = len(toks)
        k = j + 1
        if question and k < n and toks[k].text == "(" and toks[k].start == toks[j].end + 1:
            return self._disambiguator(toks, k)
        if k + 1 >= n or toks[k].start != toks[j].end:
            return None
        nxt = toks[k + 1]
        if toks[k].text == ":":
            if self._echoes(toks, k):
                return None
            first = k + 2 if nxt.text in _TITLE_ARTICLES and k + 2 < n else k + 1
            if not (_is_cap(toks[first]) and toks[first].text.lower() not in _STOP):
                return None
            end = self._span_end(toks, k + 1, question)
            after = toks[end + 1].text.lower() if end + 1 < n else ""
            return None if after in {"and", "or", ","} else end
        if toks[k].text != ",":
            return None
        if nxt.text.rstrip(".") in {"Jr", "Sr"}:  # "Sr." before "'s" is one token
            dot = k + 2 < n and toks[k + 2].text == "." and toks[k + 2].start == nxt.end
            return k + 2 if dot else k + 1
        title = k + 2 if _ORDINAL.match(nxt.text) and k + 2 < n else k + 1
        if toks[title].text not in _NOBLE_TITLES:
            return None
        if title == k + 1 and not (k + 3 < n and toks[k + 2].text.lower() == "of"
                                   and _is_cap(toks[k + 3])):
            return None  # a bare "Prince" after a comma may open a list
        return self._span_end(toks, k + 1, question)

    @staticmethod
    def _possessive_name(toks: list[_Tok], j: int) -> bool:
        """``toks[j]`` is an "X's" followed by a capitalised word that is not a question or
        date word: "Canfield's Diet Chocolate Fudge". A bare apostrophe ("the Beatles'
        Abbey Road") ends the name."""
        k = j + 1
        return (toks[j].possessive and not toks[j].text.endswith("s") and k < len(toks)
                and _is_cap(toks[k]) and toks[k].text.lower() not in _STOP
                and toks[k].text.lower() not in _DATE_WORDS)

    @staticmethod
    def _disambiguator(toks: list[_Tok], k: int, longest: int = 8) -> int | None:
        """The ")" closing a disambiguator opened at ``k``: capitalised words, numbers, year
        ranges, small words and commas ("(Film)", "(1931 Film)", "(1259–1321)", "(Wife Of
        Caesar)", "(Louisville, Kentucky)"), led by a capital or a digit; None for a clause
        ("(Barak is also known as ...)")."""
        n = len(toks)
        for m in range(k + 1, min(n, k + 2 + longest)):
            tok = toks[m]
            if tok.text == ")":
                return m if m > k + 1 else None
            if m == k + 1 and not (_is_cap(tok) or tok.text[:1].isdigit()):
                return None
            if tok.text == ",":
                continue
            if tok.kind != "word" or not (
                    _is_cap(tok) or re.fullmatch(r"[\d–\-]+(?:s|st|nd|rd|th)?", tok.text)
                    or tok.text.lower() in _SMALL_WORDS or tok.text.lower() in _CONNECTORS):
                return None
        return None

    @staticmethod
    def _echoes(toks: list[_Tok], k: int, longest: int = 12) -> bool:
        """The words just before the colon at ``k`` repeat right after it ("Kaya Alp: Kaya
        Alp was ...", "The Girl in White: The Girl in White is ..."): a model echoing a
        passage's "Title: text", not a subtitle. Joined, the echo is a name no corpus holds,
        whose zero count flags the sentence."""
        def words(span: list[_Tok]) -> list[str]:
            return [t.text.casefold() for t in span]

        return any(words(toks[k - size:k]) == words(toks[k + 1:k + 1 + size])
                   for size in range(1, min(k, len(toks) - k - 1, longest) + 1))

    @staticmethod
    def _joins_and(toks: list[_Tok], start: int, end: int, at: int) -> bool:
        """"Tom and Jerry": one capitalised word each side and no sign of a list."""
        if end != start or at + 1 >= len(toks):
            return False
        before = toks[start - 1].text.lower() if start > 0 else ""
        if before in {"both", "between", ",", "and", "or", "either", "neither"}:
            return False
        after = toks[at + 2] if at + 2 < len(toks) else None
        return after is None or not (_is_cap(after) or after.kind == "amp")

    # ------------------------------------------------------------------ API
    def entities(self, question: str) -> list[str]:
        """Key entities of ``question``: de-duplicated, in order of appearance."""
        if not isinstance(question, str):
            raise TypeError(f"question must be a str, got {type(question).__name__}")
        toks, mentions = self._mentions(question, question=True)
        return unique_names(
            m.text for m in _key_mentions(toks, [m for m in mentions if m.kind == "entity"]))

    def claims(self, sentence: str) -> list[Claim]:
        """Claims of one sentence (partial claims for a question); ``[]`` if non-factual."""
        text = factual_text(sentence)
        if text is None:
            return []
        toks, mentions = self._mentions(text)
        if text.endswith("?"):
            return self._question_claims(toks, mentions)
        heads = [k for k, m in enumerate(mentions) if m.kind == "entity"]
        if not heads:
            return []
        out: list[Claim] = []
        head = mentions[heads[0]]
        prev = head
        for m in mentions[heads[0] + 1:]:
            if m.text.lower() == head.text.lower():
                prev = m
                continue
            if prev.possessive:
                relation = self._possessive_relation(toks, prev.last)
                out.append(Claim(head=prev.text, relation=relation, tail=m.text))
                if self._appositive(toks, m):
                    head = m  # "X's father, Y, studied at Z": Y heads what follows
                prev = m
                continue
            relation = self._relation(toks, prev.last + 1, m.first)
            out.append(Claim(head=head.text, relation=relation, tail=m.text))
            prev = m
        return unique_claims(out)

    # ------------------------------------------------------------------ relations
    def _question_claims(self, toks: list[_Tok], mentions: list[_Mention]) -> list[Claim]:
        ents = [m for m in mentions if m.kind == "entity"]
        used = {k for m in ents for k in range(m.first, m.last + 1)}
        content = [t.text for k, t in enumerate(toks)
                   if k not in used and t.kind == "word" and t.text.lower() not in _STOP
                   and t.text.lower() not in _AUX and not _is_num(t)]
        generic = " ".join(content[:3])
        out = []
        for m in ents:
            rel = self._possessive_relation(toks, m.last) if m.possessive else generic
            out.append(Claim(head=m.text, relation=rel, tail=None))
        return unique_claims(out)

    def _possessive_relation(self, toks: list[_Tok], last: int) -> str:
        """The noun phrase after "X's": "husband" in "X's husband graduate from"."""
        words: list[str] = []
        for t in toks[last + 1:]:
            low = t.text.lower()
            if t.kind != "word" or _is_cap(t) or _is_num(t) or low in _AUX or (
                    words and (low in _RELATION_STOP or low.endswith(("ed", "ing")))):
                break
            words.append(t.text)
            if len(words) == 3:
                break
        return " ".join(words)

    def _relation(self, toks: list[_Tok], start: int, end: int) -> str:
        words = [t.text for t in toks[start:end] if t.kind == "word"]
        while words and words[0].lower() in _AUX:
            words.pop(0)
        while words and words[-1].lower() in _AUX:
            words.pop()
        return " ".join(words[-self.max_relation_words:])

    @staticmethod
    def _appositive(toks: list[_Tok], m: _Mention) -> bool:
        before = toks[m.first - 1].text if m.first > 0 else ""
        after = toks[m.last + 1].text if m.last + 1 < len(toks) else ""
        return before == "," and after == ","


def _key_mentions(toks: list[_Tok], mentions: list[_Mention]) -> list[_Mention]:
    """The question's key entities among ``mentions``, as QuCo's authors' question prompt
    chooses them: "Were both of the following rock groups formed in California: Dig and
    Thinking Fellers Union Local 282?" names the groups, not California (example 6); "Are Billy
    and Barak both breeds of scenthound? (Barak is also known as a Bosnian Coarse-haired
    Hound)" names Billy and Barak, not the aside (example 7). So: after "the following ...:"
    only the listed entities count, and entities inside a parenthesised aside count only
    when nothing outside it is named."""
    colon = next((k for k, t in enumerate(toks) if t.text == ":"), None)
    if colon is not None and any(t.text.lower() == "following" for t in toks[:colon]):
        listed = [m for m in mentions if m.first > colon]
        if listed:
            mentions = listed
    depth, inside = 0, set()
    for k, tok in enumerate(toks):
        if tok.text == "(":
            depth += 1
        elif tok.text == ")":
            depth = max(0, depth - 1)
        elif depth:
            inside.add(k)
    outside = [m for m in mentions if m.first not in inside]
    return outside or mentions
